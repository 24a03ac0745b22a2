"""A host's customers (parties) and their passkeys: enrolment links, enrolling, removing.

enrolment link
    One-time, for one party: the host asks for it (``party_enrolment_request``) and
    delivers it inside its signed-in app, which is how the host vouches for the person.
    Only the token's hash is kept (``common.credentials``); the token travels in the
    URL's fragment, so it never reaches a server's access log or a ``Referer``.
enrolling
    ``party_passkey_enrol``: the enrolment is used in the same transaction as the passkey
    it adds, by a conditional update, so two tabs racing on one link add one passkey.
removing
    ``party_passkey_remove``: marked removed (never deleted: the audit log names it, and
    the decisions it signed while enrolled still verify from the log).

Each is an audit event on the system chain, written in the same transaction:
``party_enrolment_requested``, ``party_passkey_added`` (with the credential id and the
public key a signed decision is later checked against), ``party_passkey_removed``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Party, PartyEnrolment, PartyPasskey
from approvals.services.errors import ApprovalError
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.credentials import token_hash, token_new
from common.errors import ErrorCode


def party_actor(party: Party) -> Actor:
    """Who a party is on the audit log and in a statement they sign (``Actor.party``)."""
    return Actor.party(party)


def party_named(party: Party) -> dict[str, object]:
    """How an event names the party: the host, the host's id for them, and the row."""
    return {"host": party.host, "party": party.party, "party_id": party.pk}


def party_for_host(*, host: str, party: str) -> Party:
    """The host's party ``party``, or ``unknown_party``: a host sees only its own."""
    found = Party.objects.filter(host=host, party=party).first()
    if found is None:
        raise ApprovalError(ErrorCode.UNKNOWN_PARTY, f"no party {party!r} for this host")
    return found


def party_record(*, host: str, party: str, display_name: str = "", contact: str = "") -> Party:
    """The (host, party) row, made if needed; a name or contact given replaces the kept one."""
    found, created = Party.objects.get_or_create(
        host=host, party=party, defaults={"display_name": display_name, "contact": contact}
    )
    changes = {
        name: value
        for name, value in (("display_name", display_name), ("contact", contact))
        if value and getattr(found, name) != value
    }
    if not created and changes:
        Party.objects.filter(pk=found.pk).update(**changes, updated_at=timezone.now())
        for name, value in changes.items():
            setattr(found, name, value)
    return found


@audit_transaction()
def party_enrolment_request(
    *, host: str, party: str, actor: Actor, display_name: str = "", contact: str = ""
) -> tuple[PartyEnrolment, str]:
    """A one-time enrolment link's row and its token (returned once, stored hashed)."""
    row = party_record(host=host, party=party, display_name=display_name, contact=contact)
    token, hashed = token_new("enrolment")
    now = timezone.now()
    enrolment = PartyEnrolment.objects.create(
        party=row,
        token_hash=hashed,
        requested_by=actor,
        created_at=now,
        expires_at=now + timedelta(seconds=settings.SETTLE_ENROLMENT_LINK_SECONDS),
    )
    audit_append(
        kind=AuditKind.PARTY_ENROLMENT_REQUESTED,
        actor=actor,
        data={
            **party_named(row),
            "enrolment_id": str(enrolment.id),
            "expires_at": enrolment.expires_at.isoformat(),
        },
    )
    return enrolment, token


def enrolment_refusal(enrolment: PartyEnrolment | None, now: datetime) -> ErrorCode | None:
    """Why ``enrolment`` cannot enrol a passkey now, if so."""
    if enrolment is None:
        return ErrorCode.ENROLMENT_UNKNOWN
    if enrolment.used_at is not None:
        return ErrorCode.ENROLMENT_USED
    if enrolment.expires_at <= now:
        return ErrorCode.ENROLMENT_EXPIRED
    return None


def enrolment_for_token(*, token: str) -> PartyEnrolment:
    """The usable enrolment ``token`` names, with its party; else its refusal."""
    enrolment = (
        PartyEnrolment.objects.select_related("party").filter(token_hash=token_hash(token)).first()
        if token
        else None
    )
    refusal = enrolment_refusal(enrolment, timezone.now())
    if refusal is not None:
        raise ApprovalError(refusal)
    assert enrolment is not None
    return enrolment


@audit_transaction()
def party_passkey_enrol(
    *, token: str, credential_id: str, public_key: str, sign_count: int = 0, name: str = ""
) -> PartyPasskey:
    """Add the passkey the enrolment ``token`` was for, using the enrolment up.

    The enrolment is read locked and used by a conditional update: of two tabs racing on
    one link, one adds its passkey and the other is told it was used.
    """
    hashed = token_hash(token) if token else ""
    enrolment = (
        PartyEnrolment.objects.select_for_update().filter(token_hash=hashed).first()
        if hashed
        else None
    )
    # Read the clock only now, with the enrolment locked: the moment it is used.
    now = timezone.now()
    refusal = enrolment_refusal(enrolment, now)
    if refusal is not None:
        raise ApprovalError(refusal)
    assert enrolment is not None
    used = PartyEnrolment.objects.filter(pk=enrolment.pk, used_at=None).update(used_at=now)
    if used != 1:
        raise ApprovalError(ErrorCode.ENROLMENT_USED)
    party = Party.objects.get(pk=enrolment.party_id)
    try:
        with transaction.atomic():
            passkey = PartyPasskey.objects.create(
                party=party,
                credential_id=credential_id,
                public_key=public_key,
                sign_count=sign_count,
                name=name[:100],
            )
    except IntegrityError:
        raise ApprovalError(
            ErrorCode.REGISTRATION_INVALID, "this passkey is enrolled already"
        ) from None
    audit_append(
        kind=AuditKind.PARTY_PASSKEY_ADDED,
        actor=party_actor(party),
        data={
            **party_named(party),
            "passkey_id": passkey.pk,
            "name": passkey.name,
            "enrolment_id": str(enrolment.id),
            "credential_id": credential_id,
            "public_key": public_key,
        },
    )
    return passkey


@audit_transaction()
def party_passkey_remove(
    *, party: Party, passkey_id: int, actor: Actor
) -> tuple[PartyPasskey, bool]:
    """Remove the party's passkey ``passkey_id`` (it signs nothing from now on); whether
    this call removed it (False: it was removed already, and nothing is recorded)."""
    passkey = PartyPasskey.objects.select_for_update().filter(pk=passkey_id, party=party).first()
    if passkey is None:
        raise ApprovalError(ErrorCode.UNKNOWN_PASSKEY, "no such passkey of this party")
    if passkey.removed_at is not None:
        return passkey, False
    now = timezone.now()
    moved = PartyPasskey.objects.filter(pk=passkey.pk, removed_at=None).update(
        removed_at=now, removed_by=actor
    )
    if moved != 1:
        passkey.refresh_from_db()
        return passkey, False
    passkey.removed_at, passkey.removed_by = now, actor
    audit_append(
        kind=AuditKind.PARTY_PASSKEY_REMOVED,
        actor=actor,
        data={
            **party_named(party),
            "passkey_id": passkey.pk,
            "credential_id": passkey.credential_id,
        },
    )
    return passkey, True
