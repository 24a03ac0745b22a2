"""Signing a decision with one's stored passkeys: the browser's request, the record it returns.

begin
    ``signing_options``: the ``PublicKeyCredentialRequestOptions`` for the browser's
    ``navigator.credentials.get``: the statement's challenge, the person's passkeys, user
    verification required, the relying party allauth registered them for.
finish
    ``signed_record_verify``: the browser's assertion checked against the person's
    *current* passkeys (a removed one signs nothing) with ``common.webauthn``, its sign
    count checked against the last one seen, and the record to keep on the vote.

The statement is the server's: the view keeps it (in the session) between the two
steps and passes the same one to both, so the challenge is never the browser's word.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allauth.mfa.adapter import get_adapter
from allauth.mfa.models import Authenticator
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from fido2.rpid import verify_rp_id
from fido2.utils import websafe_decode
from fido2.webauthn import (
    AuthenticatorTransport,
    PublicKeyCredentialDescriptor,
    PublicKeyCredentialRequestOptions,
    PublicKeyCredentialType,
    UserVerificationRequirement,
)

from audit.chain import audit_transaction
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from common.statements import challenge_of
from common.webauthn import SignatureInvalid, assertion_record, assertion_verify
from identity.models import PasskeyUse
from identity.passkeys import passkey_credential
from recovery.models import Operation
from recovery.services.locking import operation_lock

# How long the browser waits for the person to unlock their passkey (milliseconds).
TIMEOUT_MS = 120_000


@dataclass(frozen=True)
class _Passkey:
    credential_id: str
    public_key: str
    transports: list[str]


def _passkeys(user: AbstractBaseUser) -> list[_Passkey]:
    """The person's registered passkeys, as of now."""
    found = []
    for row in Authenticator.objects.filter(user_id=user.pk, type=Authenticator.Type.WEBAUTHN):
        credential = passkey_credential(row)
        transports = row.data["credential"].get("response", {}).get("transports") or []
        found.append(_Passkey(credential["credential_id"], credential["public_key"], transports))
    return found


def _rp_id(rp_id: str | None) -> str:
    """The relying party's id as allauth registers passkeys: the host of the request."""
    return rp_id or str(get_adapter().get_public_key_credential_rp_entity()["id"])


def signing_options(
    *, user: AbstractBaseUser, statement: dict[str, Any], rp_id: str | None = None
) -> dict[str, Any]:
    """What the browser passes to ``navigator.credentials.get`` to sign ``statement``.

    ``{"publicKey": {...}}`` in WebAuthn's JSON form (base64url), as allauth's own
    ``webauthnJSON.get`` takes it. ``rp_id`` defaults to the host of the request being
    served (allauth's context). ``no_passkey`` when the person has none.
    """
    passkeys = _passkeys(user)
    if not passkeys:
        raise SettleError(ErrorCode.NO_PASSKEY)
    options = PublicKeyCredentialRequestOptions(
        challenge=challenge_of(statement),
        timeout=TIMEOUT_MS,
        rp_id=_rp_id(rp_id),
        allow_credentials=[
            PublicKeyCredentialDescriptor(
                type=PublicKeyCredentialType.PUBLIC_KEY,
                id=websafe_decode(passkey.credential_id),
                transports=_transports(passkey.transports),
            )
            for passkey in passkeys
        ],
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    return {"publicKey": dict(options)}


def _transports(names: list[str]) -> list[AuthenticatorTransport] | None:
    # fido2 reads a transport it does not know as None: the browser would refuse it.
    known = [AuthenticatorTransport(name) for name in names]
    return [transport for transport in known if transport] or None


def _origins(rp_id: str) -> Callable[[str], bool]:
    """The origins allowed to sign: those allauth's fido2 server accepts for ``rp_id``."""
    if settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN:
        return lambda origin: True
    return lambda origin: verify_rp_id(rp_id, origin)


def _refused(code: ErrorCode, reason: str, message: str | None = None) -> SettleError:
    return SettleError(code, message, reason=reason)


def signed_record_verify(
    *,
    user: AbstractBaseUser,
    statement: dict[str, Any],
    assertion_json: str | dict[str, Any],
    rp_id: str | None = None,
) -> dict[str, Any]:
    """The record of ``user``'s passkey signing ``statement``, once the browser's assertion
    (``PublicKeyCredential.toJSON()``, as text or parsed) is checked.

    Refused (``SettleError``): ``signature_invalid`` (a malformed assertion, a statement
    that is not this person's, or any ``SignatureInvalid`` reason, in ``extra``),
    ``no_passkey``, ``passkey_unknown`` (not one of the person's current passkeys),
    ``sign_count_replayed``; each refusal is recorded (``signature_refused``), in a
    transaction of its own. The sign count is recorded in the caller's transaction,
    if any: a decision that then fails to commit leaves the count where it was.
    """
    try:
        return _verified(user, statement, assertion_json, rp_id)
    except SettleError as refusal:
        signature_refusal_record(user=user, statement=statement, refusal=refusal)
        raise


def signature_refusal_record(
    *,
    user: AbstractBaseUser | None = None,
    statement: dict[str, Any],
    refusal: SettleError,
    actor: Actor | None = None,
) -> None:
    """The ``signature_refused`` event: on the chain of the operation the statement
    names, if any (a bulk batch's is the system chain's), in a transaction of its own.

    By ``user``, or by ``actor`` (a host's customer, who is no user)."""
    data: dict[str, str] = {
        "kind": str(statement.get("kind", "")),
        "decision": str(statement.get("decision", "")),
        "message": str(refusal.extra.get("reason", "")) or refusal.message,
        **{
            name: str(statement[name])
            for name in ("approval_id", "request_id", "batch_id")
            if name in statement
        },
    }
    if actor is None:
        assert user is not None, "a refusal is someone's"
        actor = Actor.of("user", user)
    key = statement.get("operation_key")
    with audit_transaction():
        operation = Operation.objects.filter(key=key).first() if key else None
        locked = operation_lock(operation) if operation is not None else None
        refusal_append(
            kind=AuditKind.SIGNATURE_REFUSED,
            code=refusal.code,
            operation=locked,
            actor=actor,
            data=data,
        )


@transaction.atomic
def _verified(
    user: AbstractBaseUser,
    statement: dict[str, Any],
    assertion_json: str | dict[str, Any],
    rp_id: str | None,
) -> dict[str, Any]:
    try:
        record = assertion_record(statement, assertion_json)
    except SignatureInvalid as exc:
        raise _refused(ErrorCode.SIGNATURE_INVALID, exc.reason, str(exc)) from None
    if statement.get("person") != Actor.of("user", user).stored:
        raise _refused(
            ErrorCode.SIGNATURE_INVALID, "wrong_person", "the statement is another person's"
        )
    passkeys = _passkeys(user)
    if not passkeys:
        raise SettleError(ErrorCode.NO_PASSKEY)
    credential_id = record["credential_id"]
    passkey = next((p for p in passkeys if p.credential_id == credential_id), None)
    if passkey is None:
        raise SettleError(ErrorCode.PASSKEY_UNKNOWN)
    relying_party = _rp_id(rp_id)
    try:
        count = assertion_verify(
            public_key=passkey.public_key,
            record=record,
            rp_id=relying_party,
            origins=_origins(relying_party),
        )
    except SignatureInvalid as exc:
        raise _refused(ErrorCode.SIGNATURE_INVALID, exc.reason, str(exc)) from None
    _sign_count_advance(credential_id, count)
    return record


def _sign_count_advance(credential_id: str, count: int) -> None:
    """Keep ``count`` as the passkey's last, or refuse one that did not increase.

    An authenticator that keeps no count reports 0 every time (many synced passkeys
    do): only when either count is not 0 must it grow. Compare-and-set, so two uses
    racing with the same count cannot both pass.
    """
    now = timezone.now()
    use, created = PasskeyUse.objects.get_or_create(
        credential_id=credential_id, defaults={"sign_count": count, "last_used_at": now}
    )
    if created:
        return
    last = use.sign_count
    if (count or last) and count <= last:
        raise SettleError(ErrorCode.SIGN_COUNT_REPLAYED, sign_count=count, last_sign_count=last)
    moved = PasskeyUse.objects.filter(pk=use.pk, sign_count=last).update(
        sign_count=count, last_used_at=now
    )
    if moved != 1:
        # Another use of the passkey moved the count since it was read.
        raise SettleError(ErrorCode.SIGN_COUNT_REPLAYED, sign_count=count, last_sign_count=last)
