"""Signing a decision with one's passkey from a console page: the steps every kind shares.

begin
    ``signing_begin``: the page's script posts the decision it is about to take; the
    view makes the statement (``common.statements``: an approval, a reconciliation
    request or a bulk batch) and this keeps it in the session, under its kind and
    subject, and answers the browser's WebAuthn options as JSON (``static/settle/sign.js``).
finish
    ``signed_record``: the decision's form comes back with the browser's signed answer;
    the statement kept is taken out of the session (it signs one decision, once) and
    the answer checked against it and the person's current passkeys
    (``identity.passkey_signing``). The service then checks that the statement is its decision.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.auth.base_user import AbstractBaseUser
from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from common.errors import ErrorCode, SettleError
from common.statements import SUBJECTS
from identity.passkey_signing import signature_refusal_record, signed_record_verify, signing_options
from recovery.api import error_response

# The browser's signed answer (WebAuthn JSON) is a few hundred bytes; this bounds it.
CREDENTIAL_MAX_CHARS = 16_000


def _session_key(kind: str, subject: object) -> str:
    return f"settle_signing:{kind}:{subject}"


def person(request: HttpRequest) -> AbstractBaseUser:
    assert isinstance(request.user, AbstractBaseUser)  # login_required
    return request.user


def json_refusal(code: ErrorCode, message: str, **more: str) -> JsonResponse:
    """A refusal the page's script shows: its stable code and what to do."""
    return error_response(code, message, **more)


def signing_begin(request: HttpRequest, *, subject: object, signed: dict[str, str]) -> JsonResponse:
    """The WebAuthn options for the person's passkey to sign ``signed``, a statement of
    ``signed["kind"]`` on ``subject``, kept in the session until the decision comes back.

    ``no_passkey`` (with where to register one) for a person who has none.
    """
    try:
        options = signing_options(user=person(request), statement=signed)
    except SettleError as exc:
        return json_refusal(exc.code, exc.message, register=reverse("mfa_add_webauthn"))
    request.session[_session_key(signed["kind"], subject)] = signed
    return JsonResponse(options)


def signed_record(
    request: HttpRequest, *, kind: str, subject: object, decision: str, operation_key: str = ""
) -> dict[str, Any] | None:
    """The checked record of the passkey's signature the decision's form carries, or None
    when it carries none; ``SettleError`` when it does not hold.

    The statement is the one ``signing_begin`` kept for this kind, subject and decision:
    an answer to any other, or a second use of it, is refused.
    Each refusal is recorded (``signature_refused``): one that answers no kept statement
    (a second submit, a stale page) names the decision the form claimed, on
    ``operation_key``'s chain (none: the system chain's).
    """
    credential = request.POST.get("credential", "")
    if not credential:
        return None
    signed = request.session.pop(_session_key(kind, subject), None)
    if not isinstance(signed, dict) or signed.get("decision") != decision:
        claimed = {
            "kind": kind,
            "decision": decision,
            SUBJECTS[kind][0]: str(subject),
            "operation_key": operation_key,
        }
        _refused(request, claimed, "sign again: this page asked for no such signature")
    if len(credential) > CREDENTIAL_MAX_CHARS:
        _refused(request, signed, "the signed answer is too large")
    return signed_record_verify(user=person(request), statement=signed, assertion_json=credential)


def _refused(request: HttpRequest, statement: dict[str, Any], message: str) -> NoReturn:
    refusal = SettleError(ErrorCode.SIGNATURE_INVALID, message)
    signature_refusal_record(user=person(request), statement=statement, refusal=refusal)
    raise refusal
