"""A customer's passkeys: enrolling one (WebAuthn ``create``) and signing a decision with it.

relying party
    The same as staff passkeys': the host of the request (as allauth registers them), and
    the origins fido2 allows it (any, with ``MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN``), so a
    customer's passkey and a staff member's are checked alike (``common.webauthn``).
state
    What the server must remember between the two steps of a ceremony (the challenge,
    the statement to sign) travels to the browser and back signed with Django's
    ``signing`` (HMAC under ``SECRET_KEY``, with a salt per use and an age limit): the
    customer has no session, and the browser's word still decides nothing.

Enrolment: ``enrolment_options`` for ``navigator.credentials.create``, then
``enrolment_finish`` verifies the answer with fido2's ``Fido2Server`` and stores the
``PartyPasskey`` (``approvals.services.parties.party_passkey_enrol``, which uses the
one-time enrolment up). Signing: ``party_signing_options`` for
``navigator.credentials.get`` over the statement's challenge, then
``party_signed_record_verify`` checks the assertion against the party's own current
passkeys and advances the sign count; on the approval page, ``decision_signing_begin``
and ``decision_signed_record`` wrap both around the statement of the party's decision.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.http import HttpRequest
from fido2 import cbor
from fido2.rpid import verify_rp_id
from fido2.server import Fido2Server
from fido2.utils import websafe_decode, websafe_encode
from fido2.webauthn import (
    PublicKeyCredentialDescriptor,
    PublicKeyCredentialRequestOptions,
    PublicKeyCredentialRpEntity,
    PublicKeyCredentialType,
    PublicKeyCredentialUserEntity,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from approvals.models import Approval, Party, PartyPasskey
from approvals.services.errors import ApprovalError
from approvals.services.parties import enrolment_for_token, party_actor, party_passkey_enrol
from common.errors import ErrorCode, SettleError
from common.statements import approval_subject, challenge_of, statement
from common.webauthn import SignatureInvalid, assertion_record, assertion_verify
from identity.passkey_signing import TIMEOUT_MS, signature_refusal_record

# How long a ceremony's signed state is good for: the browser's own wait, and a little.
STATE_SECONDS = TIMEOUT_MS // 1000 + 60
_ENROL_SALT = "customers.passkeys.enrol"


def rp_id(request: HttpRequest) -> str:
    """The relying party's id: the host the browser reached, as for staff passkeys."""
    return request.get_host().partition(":")[0]


def _origins(relying_party: str) -> Callable[[str], bool]:
    if settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN:
        return lambda origin: True
    return lambda origin: verify_rp_id(relying_party, origin)


def _server(relying_party: str) -> Fido2Server:
    rp = PublicKeyCredentialRpEntity(name="Settle", id=relying_party)
    return Fido2Server(rp, verify_origin=_origins(relying_party))


def _current(party: Party) -> list[PartyPasskey]:
    return list(PartyPasskey.objects.filter(party=party, removed_at=None).order_by("pk"))


def _descriptors(passkeys: list[PartyPasskey]) -> list[PublicKeyCredentialDescriptor]:
    return [
        PublicKeyCredentialDescriptor(
            type=PublicKeyCredentialType.PUBLIC_KEY, id=websafe_decode(passkey.credential_id)
        )
        for passkey in passkeys
    ]


def enrolment_options(*, token: str, relying_party: str) -> dict[str, Any]:
    """What the enrolment page needs for ``navigator.credentials.create``: the options
    (WebAuthn's JSON form), the signed ``state`` to send back, and who enrols."""
    enrolment = enrolment_for_token(token=token)
    party = enrolment.party
    user = PublicKeyCredentialUserEntity(
        # Opaque and stable per (host, party): the authenticator keeps one passkey for it.
        id=hashlib.sha256(f"{party.host}\0{party.party}".encode()).digest()[:16],
        name=party.party,
        display_name=party.display_name or party.party,
    )
    options, state = _server(relying_party).register_begin(
        user,
        credentials=_descriptors(_current(party)),
        resident_key_requirement=ResidentKeyRequirement.PREFERRED,
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    public_key = dict(options)["publicKey"]
    signed_state = signing.dumps(
        {"state": state, "enrolment": str(enrolment.id), "rp_id": relying_party},
        salt=_ENROL_SALT,
    )
    return {
        "publicKey": {**dict(public_key), "timeout": TIMEOUT_MS},
        "state": signed_state,
        "display_name": party.display_name or party.party,
    }


def _state(signed_state: str, salt: str) -> dict[str, Any]:
    try:
        state = signing.loads(signed_state, salt=salt, max_age=STATE_SECONDS)
    except (signing.BadSignature, TypeError):
        raise ApprovalError(
            ErrorCode.REGISTRATION_INVALID, "the page's state is stale: reload it"
        ) from None
    if not isinstance(state, dict):
        raise ApprovalError(ErrorCode.REGISTRATION_INVALID, "the page's state is stale")
    return state


def enrolment_finish(
    *,
    token: str,
    signed_state: str,
    credential: Mapping[str, Any],
    relying_party: str,
    name: str = "",
) -> PartyPasskey:
    """Verify the browser's registration (``PublicKeyCredential.toJSON()``) against the
    state ``enrolment_options`` signed, and enrol the passkey for the link's party."""
    state = _state(signed_state, _ENROL_SALT)
    enrolment = enrolment_for_token(token=token)
    if state.get("enrolment") != str(enrolment.id) or state.get("rp_id") != relying_party:
        raise ApprovalError(ErrorCode.REGISTRATION_INVALID, "the page's state is another's")
    try:
        auth_data = _server(relying_party).register_complete(state["state"], credential)
    except (ValueError, TypeError, LookupError, AttributeError) as exc:
        raise ApprovalError(ErrorCode.REGISTRATION_INVALID, str(exc) or None) from None
    data = auth_data.credential_data
    assert data is not None  # a registration always carries its credential
    return party_passkey_enrol(
        token=token,
        credential_id=websafe_encode(data.credential_id),
        public_key=websafe_encode(cbor.encode(dict(data.public_key))),
        sign_count=auth_data.counter,
        name=name,
    )


def party_signing_options(
    *, party: Party, statement: dict[str, Any], relying_party: str
) -> dict[str, Any]:
    """What the browser passes to ``navigator.credentials.get`` to sign ``statement``
    with one of the party's current passkeys; ``party_no_passkey`` when they have none
    (the page tells them to ask the host's app for enrolment)."""
    passkeys = _current(party)
    if not passkeys:
        raise SettleError(ErrorCode.PARTY_NO_PASSKEY)
    options = PublicKeyCredentialRequestOptions(
        challenge=challenge_of(statement),
        timeout=TIMEOUT_MS,
        rp_id=relying_party,
        allow_credentials=_descriptors(passkeys),
        user_verification=UserVerificationRequirement.REQUIRED,
    )
    return {"publicKey": dict(options)}


def party_signed_record_verify(
    *,
    party: Party,
    statement: dict[str, Any],
    assertion_json: str | Mapping[str, Any],
    relying_party: str,
) -> dict[str, Any]:
    """The record of the party's passkey signing ``statement`` (``common.webauthn``),
    once the browser's assertion is checked against the party's own current passkeys.

    Refused (``SettleError``): ``signature_invalid`` (with the reason), ``party_no_passkey``,
    ``party_passkey_unknown`` (another party's or another host's passkey, or a removed
    one: it signs nothing), ``sign_count_replayed``; each refusal is recorded
    (``signature_refused``, by the party, on the chain of the operation the statement
    names), in a transaction of its own. The sign count is recorded in the caller's
    transaction, if any: a decision that then fails to commit leaves it where it was.
    """
    try:
        return _verified(party, statement, assertion_json, relying_party)
    except SettleError as refusal:
        signature_refusal_record(actor=party_actor(party), statement=statement, refusal=refusal)
        raise


@transaction.atomic
def _verified(
    party: Party,
    statement: dict[str, Any],
    assertion_json: str | Mapping[str, Any],
    relying_party: str,
) -> dict[str, Any]:
    try:
        record = assertion_record(statement, assertion_json)
    except SignatureInvalid as exc:
        raise SettleError(ErrorCode.SIGNATURE_INVALID, str(exc), reason=exc.reason) from None
    if statement.get("person") != party_actor(party).stored:
        raise SettleError(
            ErrorCode.SIGNATURE_INVALID, "the statement is another person's", reason="wrong_person"
        )
    passkeys = _current(party)
    if not passkeys:
        raise SettleError(ErrorCode.PARTY_NO_PASSKEY)
    credential_id = record["credential_id"]
    passkey = next((p for p in passkeys if p.credential_id == credential_id), None)
    if passkey is None:
        raise SettleError(ErrorCode.PARTY_PASSKEY_UNKNOWN)
    try:
        count = assertion_verify(
            public_key=passkey.public_key,
            record=record,
            rp_id=relying_party,
            origins=_origins(relying_party),
        )
    except SignatureInvalid as exc:
        raise SettleError(ErrorCode.SIGNATURE_INVALID, str(exc), reason=exc.reason) from None
    _sign_count_advance(passkey, count)
    return record


def _sign_count_advance(passkey: PartyPasskey, count: int) -> None:
    """Keep ``count`` as the passkey's last, or refuse one that did not increase (only
    when either is not 0: many synced passkeys keep no count). Compare-and-set, so two
    uses racing with the same count cannot both pass."""
    last = passkey.sign_count
    if (count or last) and count <= last:
        raise SettleError(ErrorCode.SIGN_COUNT_REPLAYED, sign_count=count, last_sign_count=last)
    moved = PartyPasskey.objects.filter(pk=passkey.pk, sign_count=last, removed_at=None).update(
        sign_count=count
    )
    if moved != 1:
        raise SettleError(ErrorCode.SIGN_COUNT_REPLAYED, sign_count=count, last_sign_count=last)


SIGN_SALT = "customers.passkeys.sign"


def decision_statement(*, approval: Approval, party: Party, decision: str) -> dict[str, str]:
    """The statement of the party's ``decision`` on ``approval``: the same canonical one
    staff sign (approval id, operation key, params digest, decision, the party, a nonce
    and the moment)."""
    subject = approval_subject(
        approval_id=approval.pk,
        operation_key=approval.operation_key,
        params_digest=approval.params_digest,
    )
    return statement("approval", subject, decision=decision, person=party_actor(party).stored)


def decision_signing_begin(
    *, approval: Approval, party: Party, decision: str, relying_party: str
) -> dict[str, Any]:
    """What the page needs to sign the party's ``decision``: the options for
    ``navigator.credentials.get`` and the statement, signed by Settle so that the browser
    sends back the very one the challenge was made of (``decision_signed_record``)."""
    signed = decision_statement(approval=approval, party=party, decision=decision)
    options = party_signing_options(party=party, statement=signed, relying_party=relying_party)
    return {**options, "statement": signing.dumps(signed, salt=SIGN_SALT)}


def decision_signed_record(
    *,
    approval: Approval,
    party: Party,
    decision: str,
    signed_statement: str,
    credential: str,
    relying_party: str,
) -> dict[str, Any]:
    """The record of the party's passkey signing their ``decision`` on ``approval``: the
    statement Settle made (``decision_signing_begin``), for this approval and decision,
    and the browser's assertion checked by ``party_signed_record_verify``."""
    try:
        signed = signing.loads(signed_statement, salt=SIGN_SALT, max_age=STATE_SECONDS)
    except (signing.BadSignature, TypeError):
        signed = None
    expected = {"approval_id": str(approval.pk), "decision": decision}
    if not isinstance(signed, dict) or any(signed.get(k) != v for k, v in expected.items()):
        refusal = SettleError(
            ErrorCode.SIGNATURE_INVALID,
            "the statement is stale or another decision's: sign again",
            reason="wrong_statement",
        )
        signature_refusal_record(
            actor=party_actor(party),
            statement=decision_statement(approval=approval, party=party, decision=decision),
            refusal=refusal,
        )
        raise refusal
    return party_signed_record_verify(
        party=party, statement=signed, assertion_json=credential, relying_party=relying_party
    )
