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

from approvals import services as approvals
from approvals.actors import Actor
from approvals.models import Approver
from recovery import selectors
from recovery.canonical import MAX_SAFE_INTEGER, CanonicalError, strict_loads
from recovery.models import Host
from recovery.openapi import openapi_document
from recovery.services import (
    callbacks,
    credentials,
    dispatch,
    errors,
    locking,
    permits,
    registration,
    resume,
)

logger = logging.getLogger("settle.api")

# The HTTP status of each code a service raises; any other refusal is 409 Conflict.
STATUS_BY_CODE = {
    "unknown_operation": 404,
    "unknown_approval": 404,
    "unknown_permit": 404,
    "unknown_provider": 404,
    "forbidden": 403,
    "invalid_ttl": 422,
}

KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@~-]{0,199}$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@~ -]{0,199}$")
DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
# Fencing tokens are printable ASCII (token_urlsafe); anything else cannot be one.
TOKEN_PATTERN = re.compile(r"^[!-~]{1,64}$")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def error_response(status: int, code: str, message: str, /, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": code, "message": message, **extra}, status=status)


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


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "use 'Authorization: Bearer <token>'")
    return token.strip()


def _authenticate(request: HttpRequest, allowed: tuple[str, ...]) -> Caller:
    token = _bearer(request)
    if token is not None:
        # Each kind of token carries its prefix, so one lookup finds its owner.
        host = approver = None
        if token.startswith(approvals.APPROVER_TOKEN_PREFIX):
            approver = approvals.approver_authenticate(token=token)
        else:
            host = credentials.host_authenticate(token=token)
        if host is not None:
            caller = Caller(Actor.of("host", host), host=host)
        elif approver is not None:
            caller = Caller(Actor.of("approver", approver), approver=approver)
        else:
            raise ApiError(401, "unauthorized", "unknown or revoked token")
    elif "user" in allowed and request.user.is_authenticated:
        # A console session: the browser's cookie must come with its CSRF token.
        if CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
            request, lambda r: HttpResponse(), (), {}
        ):
            raise ApiError(403, "csrf_failed", "CSRF token missing or incorrect")
        caller = Caller(Actor.of("user", request.user), user=request.user)
    else:
        raise ApiError(401, "unauthorized", "an Authorization bearer token is required")
    if caller.kind not in allowed:
        raise ApiError(403, "forbidden", f"a {caller.kind} credential may not do this")
    return caller


def api_view(
    *, methods: tuple[str, ...], auth: tuple[str, ...]
) -> Callable[[Callable[..., JsonResponse]], Callable[..., HttpResponse]]:
    """Method check, authentication and error mapping shared by every endpoint."""

    def decorate(view: Callable[..., JsonResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error_response(405, "method_not_allowed", f"use {' or '.join(methods)}")
                response["Allow"] = ", ".join(methods)
                return response
            caller: Caller | None = None
            try:
                caller = _authenticate(request, auth) if auth else None
                return view(request, caller, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message, **exc.extra)
            except errors.RecoveryError as exc:
                status = STATUS_BY_CODE.get(exc.code, 409)
                return error_response(status, exc.code, exc.message, **exc.extra)
            except DatabaseError:
                logger.exception("database error in %s %s", request.method, request.path)
                return error_response(
                    503, "database_unavailable", "the database refused the change; retry"
                )

        return wrapper

    return decorate


# -- body parsing ---------------------------------------------------------------------


def _raw_body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise ApiError(413, "body_too_large", "the request body is too large") from None


def _json_body(request: HttpRequest) -> dict[str, Any]:
    content_type = request.content_type or ""
    if content_type not in {"application/json", ""}:
        raise ApiError(415, "unsupported_media_type", "send Content-Type: application/json")
    raw = _raw_body(request)
    if not raw:
        raise ApiError(400, "malformed_json", "the request body is empty")
    try:
        body = strict_loads(raw)
    except CanonicalError as exc:
        raise ApiError(400, exc.code, exc.message) from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", "the request body must be a JSON object")
    return body


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...] | None  # None: any JSON value
    required: bool = True
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] = ()
    max_length: int = 500
    minimum: int | None = None
    maximum: int | None = None


def _parse(request: HttpRequest, spec: dict[str, Field]) -> dict[str, Any]:
    body = _json_body(request)
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise ApiError(
            400, "unknown_field", f"unknown field(s): {', '.join(unknown)}", fields=unknown
        )
    values: dict[str, Any] = {}
    for name, field in spec.items():
        if name not in body:
            if field.required:
                raise ApiError(422, "missing_field", f"{name} is required", field=name)
            continue
        values[name] = _check_field(name, body[name], field)
    return values


def _check_field(name: str, value: Any, field: Field) -> Any:
    def invalid(why: str) -> ApiError:
        return ApiError(422, "invalid_field", f"{name} {why}", field=name)

    if field.kind is None:
        return value
    if isinstance(value, bool) and field.kind is not bool:
        raise invalid("has the wrong type")
    if not isinstance(value, field.kind):
        raise invalid("has the wrong type")
    if isinstance(value, str):
        if len(value) > field.max_length or "\x00" in value:
            raise invalid(f"must be at most {field.max_length} characters, without NUL")
        if not _valid_unicode(value):
            raise invalid("must be valid Unicode (no lone surrogates)")
        if field.pattern is not None and not field.pattern.fullmatch(value):
            raise invalid("has an invalid format")
        if field.choices and value not in field.choices:
            raise invalid(f"must be one of {', '.join(field.choices)}")
    if isinstance(value, int):
        if field.minimum is not None and value < field.minimum:
            raise invalid(f"must be at least {field.minimum}")
        if field.maximum is not None and value > field.maximum:
            raise invalid(f"must be at most {field.maximum}")
    return value


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_key(key: str) -> None:
    if not KEY_PATTERN.fullmatch(key):
        raise ApiError(404, "unknown_operation", "no such operation")


def _operation(caller: Caller | None, key: str) -> locking.OperationRef:
    """The caller's operation ``key``, to be found (404 if not) by the service that locks it."""
    _check_key(key)
    assert caller is not None and caller.host is not None
    return locking.OperationRef(key=key, host=caller.host)


def _uuid(value: str, code: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(404, code, "no such id") from None


# -- endpoints ----------------------------------------------------------------------


def _operation_summary(operation: Any) -> dict[str, Any]:
    return {
        "key": operation.key,
        "state": operation.state,
        "params_digest": operation.params_digest,
        "version": operation.version,
    }


@api_view(methods=("POST",), auth=("host",))
def operations(request: HttpRequest, caller: Caller) -> JsonResponse:
    values = _parse(
        request,
        {
            "key": Field(str, pattern=KEY_PATTERN, max_length=200),
            "action": Field(str, pattern=NAME_PATTERN, max_length=200),
            "provider": Field(str, max_length=100),
            # Any JSON value: canonical_params refuses a non-object as invalid_params.
            "params": Field(None),
        },
    )
    assert caller.host is not None
    try:
        operation, created = registration.operation_register(
            host=caller.host,
            key=values["key"],
            action=values["action"],
            provider_name=values["provider"],
            params=values["params"],
        )
    except CanonicalError as exc:
        if exc.code == "params_too_large":
            raise ApiError(413, "params_too_large", exc.message) from None
        raise ApiError(422, "invalid_params", exc.message, reason=exc.code) from None
    return JsonResponse(_operation_summary(operation), status=201 if created else 200)


@api_view(methods=("GET",), auth=("host",))
def operation_detail(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = locking.operation_read(_operation(caller, key))
    return JsonResponse(selectors.operation_record(operation=operation))


@api_view(methods=("POST",), auth=("host",))
def operation_approvals(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = _operation(caller, key)
    if _raw_body(request):
        _parse(request, {})
    assert caller.host is not None
    approval, created = permits.approval_open(operation=operation, host=caller.host)
    return JsonResponse(
        {"approval_id": str(approval.id), "status": approval.status},
        status=201 if created else 200,
    )


@api_view(methods=("POST",), auth=("approver", "user"))
def approval_decision(request: HttpRequest, caller: Caller, approval_id: str) -> JsonResponse:
    pk = _uuid(approval_id, "unknown_approval")
    values = _parse(
        request,
        {
            "decision": Field(str, choices=("approve", "deny")),
            "ttl_seconds": Field(int, required=False, minimum=1, maximum=approvals.MAX_TTL_SECONDS),
            # The digest of the parameters the approver reviewed (GET the approval).
            "params_digest": Field(str, pattern=DIGEST_PATTERN, max_length=71),
        },
    )
    if caller.kind == "user":
        selectors.approval_for_caller(approval_id=pk, user=caller.user, decide=True)
    approval, permit = permits.approval_decision(
        approval_id=pk,
        approve=values["decision"] == "approve",
        ttl_seconds=values.get("ttl_seconds", 300),
        decided_by=caller.actor,
        reviewed_digest=values["params_digest"],
        approver=caller.approver,
    )
    return JsonResponse(
        {
            "approval_id": str(approval.id),
            "status": approval.status,
            "permit_id": str(permit.id) if permit else None,
            "expires_at": permit.expires_at.isoformat() if permit else None,
        }
    )


@api_view(methods=("GET",), auth=("approver", "user"))
def approval_detail(request: HttpRequest, caller: Caller, approval_id: str) -> JsonResponse:
    """Exactly what the approver would approve: the action, its parameters, its digest."""
    pk = _uuid(approval_id, "unknown_approval")
    approval = selectors.approval_for_caller(
        approval_id=pk, approver=caller.approver, user=caller.user
    )
    return JsonResponse(selectors.approval_record(approval=approval))


@api_view(methods=("POST",), auth=("host", "approver"))
def permit_revoke(request: HttpRequest, caller: Caller, permit_id: str) -> JsonResponse:
    pk = _uuid(permit_id, "unknown_permit")
    values = _parse(request, {"reason": Field(str, max_length=500)})
    # A host may revoke only its own operations' permits; an approver those in its scope.
    permit, revoked = permits.permit_revoke(
        permit_id=pk,
        reason=values["reason"],
        actor=caller.actor,
        host=caller.host,
        approver=caller.approver,
    )
    return JsonResponse({"permit_id": str(permit.id), "status": permit.status, "revoked": revoked})


@api_view(methods=("POST",), auth=("host",))
def operation_dispatch(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = _operation(caller, key)
    values = _parse(
        request,
        {
            "worker": Field(str, pattern=NAME_PATTERN, max_length=200),
            "params_digest": Field(str, pattern=DIGEST_PATTERN, max_length=71),
        },
    )
    outcome = dispatch.operation_dispatch(
        operation=operation,
        worker=values["worker"],
        presented_digest=values["params_digest"],
        actor=caller.actor,
    )
    if outcome.dispatch is None:
        extra = {"execution_state": outcome.state} if outcome.refusal == "already_consumed" else {}
        return error_response(409, outcome.refusal, "the permit was not consumed", **extra)
    return JsonResponse(
        {
            "fencing_token": outcome.dispatch.fencing_token,
            "permit_id": str(outcome.dispatch.permit_id),
            "lease_expires_at": outcome.dispatch.lease_expires_at.isoformat(),
        }
    )


@api_view(methods=("POST",), auth=("host",))
def operation_heartbeat(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = _operation(caller, key)
    values = _parse(request, {"fencing_token": Field(str, pattern=TOKEN_PATTERN, max_length=64)})
    held = dispatch.operation_heartbeat(
        operation=operation, fencing_token=values["fencing_token"], actor=caller.actor
    )
    return JsonResponse({"lease_expires_at": held.lease_expires_at.isoformat()})


@api_view(methods=("POST",), auth=("host",))
def operation_result(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = _operation(caller, key)
    values = _parse(
        request,
        {
            "fencing_token": Field(str, pattern=TOKEN_PATTERN, max_length=64),
            "outcome": Field(str, choices=("committed", "failed")),
            "provider_reference": Field(str, required=False, max_length=200),
        },
    )
    outcome = dispatch.operation_report(
        operation=operation,
        fencing_token=values["fencing_token"],
        outcome=values["outcome"],
        provider_reference=values.get("provider_reference", ""),
        actor=caller.actor,
    )
    return JsonResponse(
        {"applied": outcome.applied, "state": outcome.state, "receipt": outcome.receipt_status}
    )


@api_view(methods=("POST",), auth=("host",))
def operation_resume(request: HttpRequest, caller: Caller, key: str) -> JsonResponse:
    operation = _operation(caller, key)
    values = _parse(request, {"worker": Field(str, pattern=NAME_PATTERN, max_length=200)})
    outcome = resume.operation_resume(
        operation=operation, worker=values["worker"], actor=caller.actor
    )
    body: dict[str, Any] = {
        "decision": outcome.decision,
        "state": outcome.state,
        "recovered": outcome.recovered,
    }
    if outcome.fencing_token:
        body["fencing_token"] = outcome.fencing_token
    if outcome.retry_after:
        body["retry_after"] = outcome.retry_after
    return JsonResponse(body)


@api_view(methods=("POST",), auth=())
def provider_callbacks(request: HttpRequest, caller: None, name: str) -> JsonResponse:
    provider = selectors.provider_for_callback(name=name)
    raw = _raw_body(request)
    signature = request.headers.get("X-Provider-Signature", "")
    # hmac.compare_digest refuses non-ASCII text; such a header cannot be a hex HMAC.
    if not signature.isascii() or not callbacks.callback_signature_valid(
        provider=provider, body=raw, signature=signature
    ):
        raise ApiError(401, "bad_signature", "missing or wrong X-Provider-Signature")
    values = _parse(
        request,
        {
            "operation_key": Field(str, pattern=KEY_PATTERN, max_length=200),
            "status": Field(str, choices=("committed", "failed")),
            "params_digest": Field(str, pattern=DIGEST_PATTERN, max_length=71),
            "reference": Field(str, max_length=200),
            "sequence": Field(int, minimum=0, maximum=MAX_SAFE_INTEGER),
        },
    )
    outcome = callbacks.provider_callback(
        provider=provider,
        operation_key=values["operation_key"],
        status=values["status"],
        params_digest=values["params_digest"],
        reference=values["reference"],
        sequence=values["sequence"],
        raw=values,
    )
    body: dict[str, Any] = {"applied": outcome.applied, "state": outcome.state}
    if outcome.reason:
        body["reason"] = outcome.reason
    return JsonResponse(body)


def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(openapi_document())
