"""The host HTTP API: thin views that parse, authenticate, call one service, answer.

Every error is JSON ``{"error": <stable code>, "message": <human text>}``; nothing here
holds a business rule.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from approvals.models import Approval, Approver
from common.actors import Actor
from common.canonical import CanonicalError, strict_loads
from common.errors import ErrorCode, SettleError
from dbsql.errors import database_unavailable
from recovery import contract, query
from recovery.contract import ApiError
from recovery.models import Host, Operation, State
from recovery.openapi import openapi_document
from recovery.ratelimit import rate_limit_wait
from recovery.selectors.access import approval_for_caller, provider_for_callback
from recovery.selectors.records import (
    approval_needs,
    approval_opened_record,
    approval_record,
    newest_permit,
    operation_record,
    permit_history_page,
)
from recovery.services import (
    callbacks,
    dispatch,
    locking,
    permits,
    registration,
    resume,
    token_cache,
    waits,
)
from recovery.services.customers import PartyNamed

logger = logging.getLogger("settle.api")

KEY_PATTERN = re.compile(contract.KEY_PATTERN)


def error_response(code: ErrorCode, message: str, /, **extra: Any) -> JsonResponse:
    """The JSON body of a refusal, with the status its code carries."""
    return JsonResponse({"error": code, "message": message, **extra}, status=code.status)


@dataclass(frozen=True)
class Caller:
    """Who is calling, and the credential row behind it (exactly one is set)."""

    actor: Actor
    host: Host | None = None
    user: Any = None
    approver: Approver | None = None

    @property
    def kind(self) -> str:
        return self.actor.kind


def carries_token(request: HttpRequest) -> bool:
    """Whether the request is the ``Authorization`` header's to answer for: then its
    token alone authenticates it, never the session's cookie (``_authenticate``)."""
    return bool(request.META.get("HTTP_AUTHORIZATION", ""))  # not .headers: built whole


def _bearer(request: HttpRequest) -> str | None:
    if not carries_token(request):
        return None
    header = str(request.META["HTTP_AUTHORIZATION"])
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(ErrorCode.UNAUTHORIZED, "use 'Authorization: Bearer <token>'")
    return token.strip()


def _authenticate(request: HttpRequest, allowed: tuple[str, ...]) -> Caller:
    token = _bearer(request)
    if token is not None:
        credential = token_cache.credential_authenticate(token=token)
        if isinstance(credential, Host):
            caller = Caller(Actor.of("host", credential), host=credential)
        elif isinstance(credential, Approver):
            caller = Caller(Actor.of("approver", credential), approver=credential)
        else:
            raise ApiError(ErrorCode.UNAUTHORIZED, "unknown or revoked token")
    elif "user" in allowed and request.user.is_authenticated:
        # A console session: the browser's cookie must come with its CSRF token.
        if CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
            request, lambda r: HttpResponse(), (), {}
        ):
            raise ApiError(ErrorCode.CSRF_FAILED, "CSRF token missing or incorrect")
        caller = Caller(Actor.of("user", request.user), user=request.user)
    else:
        raise ApiError(ErrorCode.UNAUTHORIZED, "an Authorization bearer token is required")
    if caller.kind not in allowed:
        raise ApiError(ErrorCode.FORBIDDEN, f"a {caller.kind} credential may not do this")
    return caller


def _rate_limit(caller: Caller | None) -> None:
    """429 once a bearer credential is past its rate (``recovery.ratelimit``)."""
    credential = caller.host or caller.approver if caller is not None else None
    if credential is None:
        return  # no credential, or a console session: a person at a browser
    wait = rate_limit_wait(credential=credential.token_hash)
    if wait:
        raise ApiError(
            ErrorCode.RATE_LIMITED,
            f"too many requests for this credential; retry in {wait} s",
            retry_after=wait,
        )


def api_view(
    *, methods: tuple[str, ...], auth: tuple[str, ...]
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Method check, authentication and error mapping shared by every endpoint."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error_response(
                    ErrorCode.METHOD_NOT_ALLOWED, f"use {' or '.join(methods)}"
                )
                response["Allow"] = ", ".join(methods)
                return response
            caller: Caller | None = None
            try:
                caller = _authenticate(request, auth) if auth else None
                _rate_limit(caller)
                return view(request, caller, *args, **kwargs)
            except SettleError as exc:
                response = error_response(exc.code, exc.message, **exc.extra)
                if exc.code == ErrorCode.RATE_LIMITED:
                    response["Retry-After"] = str(exc.extra["retry_after"])
                return response
            except DatabaseError as exc:
                logger.exception("database error in %s %s", request.method, request.path)
                message = database_unavailable(exc) or "the database refused the change; retry"
                return error_response(ErrorCode.DATABASE_UNAVAILABLE, message)

        return wrapper

    return decorate


# -- body parsing ---------------------------------------------------------------------


def _raw_body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise ApiError(ErrorCode.BODY_TOO_LARGE, "the request body is too large") from None


def _json_body(request: HttpRequest) -> dict[str, Any]:
    content_type = request.content_type or ""
    if content_type not in {"application/json", ""}:
        raise ApiError(ErrorCode.UNSUPPORTED_MEDIA_TYPE, "send Content-Type: application/json")
    raw = _raw_body(request)
    if not raw:
        raise ApiError(ErrorCode.MALFORMED_JSON, "the request body is empty")
    try:
        body = strict_loads(raw)
    except CanonicalError as exc:
        raise ApiError(exc.code, exc.message) from None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.INVALID_BODY, "the request body must be a JSON object")
    return body


def _parse(request: HttpRequest, model: type[contract.M]) -> contract.M:
    return contract.parse(model, _json_body(request))


def _check_key(key: str) -> None:
    if not KEY_PATTERN.fullmatch(key):
        raise ApiError(ErrorCode.UNKNOWN_OPERATION, "no such operation")


def _operation(caller: Caller | None, key: str) -> locking.OperationRef:
    """The caller's operation ``key``, to be found (404 if not) by the service that locks it."""
    _check_key(key)
    assert caller is not None and caller.host is not None
    return locking.OperationRef(key=key, host=caller.host)


def _uuid(value: str, code: ErrorCode) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(code, "no such id") from None


# -- endpoints ----------------------------------------------------------------------


def _answer(body: contract.Body, status: int = 200) -> HttpResponse:
    return HttpResponse(contract.dump_json(body), content_type="application/json", status=status)


@api_view(methods=("POST",), auth=("host",))
def operations(request: HttpRequest, caller: Caller) -> HttpResponse:
    body = _parse(request, contract.RegisterRequest)
    assert caller.host is not None
    opening = body.opening()
    asked = None
    if body.dispatch is not None:
        asked = dispatch.DispatchAsked(
            worker=body.dispatch.worker,
            presented_digest=body.dispatch.params_digest,
            actor=caller.actor,
        )
    as_registered: dict[str, Any] = {}
    opened: list[tuple[Approval, bool]] = []

    def open_new(operation: Operation) -> None:
        # A new operation's approval opens in the registration's transaction; the answer
        # says the operation as registered, as when the approval opens in one of its own.
        # Called again where that transaction runs again: the last run's answer stands.
        assert opening is not None and caller.host is not None
        as_registered.update(state=operation.state, version=operation.version)
        opened[:] = [
            permits.approval_open_locked(
                operation,
                host=caller.host,
                then=asked,
                registered=True,
                **_opening_args(opening),
            )
        ]

    try:
        operation, created = registration.operation_register(
            host=caller.host,
            key=body.key,
            action=body.action,
            provider_name=body.provider,
            params=body.params,
            then=open_new if opening is not None else None,
        )
    except CanonicalError as exc:
        if exc.code == ErrorCode.PARAMS_TOO_LARGE:
            raise ApiError(ErrorCode.PARAMS_TOO_LARGE, exc.message) from None
        raise ApiError(ErrorCode.INVALID_PARAMS, exc.message, reason=exc.code) from None
    summary: dict[str, Any] = {
        "key": operation.key,
        "state": operation.state,
        "params_digest": operation.params_digest,
        "version": operation.version,
        **as_registered,
    }
    if opened:  # its answer built once the transaction is over
        summary["approval"] = approval_opened_record(*opened[0])
    elif opening is not None and operation.state == State.AWAITING_APPROVAL:
        try:
            summary["approval"], _ = _approval_opened(caller, operation.key, opening, asked)
        except SettleError as exc:
            # Decided or dispatched since it was registered: the answer says as registered,
            # and the host goes on from the operation's state, as after a plain register.
            if exc.code != ErrorCode.INVALID_STATE:
                raise
    if asked is not None and asked.outcome is not None:  # the policy approved it
        held = _held(asked.outcome)
        summary.update({"dispatch": held} if held else {"dispatch_refused": asked.outcome.refusal})
    return _answer(contract.Registered(**summary), status=201 if created else 200)


@api_view(methods=("GET",), auth=("host",))
def operation_detail(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    """The record; with ``?wait=N``, held while it awaits approval (at most N seconds)."""
    seconds = query.wait(request)
    operation = locking.operation_read(_operation(caller, key))
    if seconds and operation.state == State.AWAITING_APPROVAL:

        def awaiting() -> bool:
            return locking.operation_state(operation) == State.AWAITING_APPROVAL

        if waits.decision_wait(operation.pk, seconds, awaiting):
            operation = locking.operation_read(operation)
    return _answer(operation_record(operation=operation))


@api_view(methods=("GET",), auth=("host",))
def operation_history(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    """A page of the history of the operation's newest permit, by cursor."""
    after, limit = query.page(request)
    operation = locking.operation_read(_operation(caller, key))
    permit = newest_permit(operation_key=operation.key)
    if permit is None:
        return _answer(contract.HistoryPage(permit_id="", lines=[], next=None))
    return _answer(permit_history_page(permit=permit, after=after, limit=limit))


@api_view(methods=("POST",), auth=("host",))
def operation_approvals(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    body = contract.OpenApprovalRequest()
    if _raw_body(request):
        body = _parse(request, contract.OpenApprovalRequest)
    opened, created = _approval_opened(caller, key, body)
    return _answer(opened, status=201 if created else 200)


def _approval_opened(
    caller: Caller,
    key: str,
    body: contract.OpenApprovalRequest,
    then: dispatch.DispatchAsked | None = None,
) -> tuple[contract.ApprovalOpened, bool]:
    """Open the approval of the caller's operation ``key`` (or find the pending one)."""
    operation = _operation(caller, key)
    assert caller.host is not None
    approval, created = permits.approval_open(
        operation=operation, host=caller.host, then=then, **_opening_args(body)
    )
    return approval_opened_record(approval, created), created


def _opening_args(body: contract.OpenApprovalRequest) -> dict[str, Any]:
    party = None
    if body.party is not None:
        party = PartyNamed(id=body.party.id, name=body.party.name, contact=body.party.contact)
    return {"proposer": body.proposer, "party": party}


@api_view(methods=("POST",), auth=("approver", "user"))
def approval_decision_view(request: HttpRequest, caller: Caller, approval_id: str) -> HttpResponse:
    pk = _uuid(approval_id, ErrorCode.UNKNOWN_APPROVAL)
    body = _parse(request, contract.DecisionRequest)
    # The service decides who may: an approver within its scope, a user with the right.
    approval, permit = permits.approval_decision(
        approval_id=pk,
        approve=body.decision == "approve",
        ttl_seconds=body.ttl_seconds,
        decided_by=caller.actor,
        reviewed_digest=body.params_digest,
        approver=caller.approver,
        reason=body.reason,
    )
    decided = contract.Decided(
        approval_id=str(approval.id),
        status=approval.status,
        permit_id=str(permit.id) if permit else None,
        expires_at=permit.expires_at.isoformat() if permit else None,
        **approval_needs(approval=approval),
    )
    return _answer(decided)


@api_view(methods=("GET",), auth=("approver", "user", "host"))
def approval_detail(request: HttpRequest, caller: Caller, approval_id: str) -> HttpResponse:
    """Exactly what the approver would approve: the action, its parameters, its digest.

    To a host, only an approval it opened (with its customer's link while pending)."""
    pk = _uuid(approval_id, ErrorCode.UNKNOWN_APPROVAL)
    approval = approval_for_caller(
        approval_id=pk, approver=caller.approver, user=caller.user, host=caller.host
    )
    return _answer(approval_record(approval=approval, to_host=caller.host is not None))


@api_view(methods=("POST",), auth=("host", "approver"))
def permit_revoke_view(request: HttpRequest, caller: Caller, permit_id: str) -> HttpResponse:
    pk = _uuid(permit_id, ErrorCode.UNKNOWN_PERMIT)
    body = _parse(request, contract.RevokeRequest)
    # A host may revoke only its own operations' permits; an approver those in its scope.
    permit, revoked = permits.permit_revoke(
        permit_id=pk,
        reason=body.reason,
        actor=caller.actor,
        host=caller.host,
        approver=caller.approver,
    )
    return _answer(
        contract.Revoked(permit_id=str(permit.id), status=permit.status, revoked=revoked)
    )


@api_view(methods=("POST",), auth=("host",))
def operation_dispatch(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    operation = _operation(caller, key)
    body = _parse(request, contract.DispatchRequest)
    outcome = dispatch.operation_dispatch(
        operation=operation,
        worker=body.worker,
        presented_digest=body.params_digest,
        actor=caller.actor,
    )
    held = _held(outcome)
    if held is None:
        refusal = ErrorCode(outcome.refusal)
        extra = {"execution_state": outcome.state} if refusal == ErrorCode.ALREADY_CONSUMED else {}
        return error_response(refusal, "the permit was not consumed", **extra)
    return _answer(held)


def _held(outcome: dispatch.DispatchOutcome) -> contract.Dispatched | None:
    """The dispatch a consumption created, as answered; None if it was refused."""
    if outcome.dispatch is None:
        return None
    return contract.Dispatched(
        fencing_token=outcome.dispatch.fencing_token,
        permit_id=str(outcome.dispatch.permit_id),
        lease_expires_at=outcome.dispatch.lease_expires_at.isoformat(),
    )


@api_view(methods=("POST",), auth=("host",))
def operation_heartbeat(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    operation = _operation(caller, key)
    body = _parse(request, contract.HeartbeatRequest)
    held = dispatch.operation_heartbeat(
        operation=operation, fencing_token=body.fencing_token, actor=caller.actor
    )
    return _answer(contract.Heartbeat(lease_expires_at=held.lease_expires_at.isoformat()))


@api_view(methods=("POST",), auth=("host",))
def operation_result(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    operation = _operation(caller, key)
    body = _parse(request, contract.ResultRequest)
    outcome = dispatch.operation_report(
        operation=operation,
        fencing_token=body.fencing_token,
        outcome=body.outcome,
        provider_reference=body.provider_reference,
        result=body.result_checked(),
        actor=caller.actor,
    )
    reported = contract.Reported(
        applied=outcome.applied, state=outcome.state, receipt=outcome.receipt_status
    )
    return _answer(reported)


@api_view(methods=("POST",), auth=("host",))
def operation_resume(request: HttpRequest, caller: Caller, key: str) -> HttpResponse:
    operation = _operation(caller, key)
    body = _parse(request, contract.ResumeRequest)
    outcome = resume.operation_resume(operation=operation, worker=body.worker, actor=caller.actor)
    # Optional fields are sent only when they say something.
    optional = {"fencing_token": outcome.fencing_token, "retry_after": outcome.retry_after}
    resumed = contract.Resumed.model_validate(
        {
            "decision": outcome.decision,
            "state": outcome.state,
            "recovered": outcome.recovered,
            **{name: value for name, value in optional.items() if value},
        }
    )
    return _answer(resumed)


@api_view(methods=("POST",), auth=())
def provider_callbacks(request: HttpRequest, caller: None, name: str) -> HttpResponse:
    provider = provider_for_callback(name=name)
    raw = _raw_body(request)
    signature = request.headers.get("X-Provider-Signature", "")
    # hmac.compare_digest refuses non-ASCII text; such a header cannot be a hex HMAC.
    if not signature.isascii() or not callbacks.callback_signature_valid(
        provider=provider, body=raw, signature=signature
    ):
        raise ApiError(ErrorCode.BAD_SIGNATURE, "missing or wrong X-Provider-Signature")
    body = _parse(request, contract.CallbackRequest)
    outcome = callbacks.provider_callback(
        provider=provider,
        operation_key=body.operation_key,
        status=body.status,
        params_digest=body.params_digest,
        reference=body.reference,
        sequence=body.sequence,
        raw=body.model_dump(),
    )
    reason = {"reason": outcome.reason} if outcome.reason else {}
    return _answer(contract.CallbackApplied(applied=outcome.applied, state=outcome.state, **reason))


def openapi(request: HttpRequest) -> HttpResponse:
    return JsonResponse(openapi_document())
