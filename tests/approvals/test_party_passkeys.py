"""A host's customer (party) and their passkeys: one-time enrolment links kept only as a
hash, enrolling once per link, removing; each on the system chain in the same transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from approvals.models import Party, PartyEnrolment, PartyPasskey
from approvals.services.errors import ApprovalError
from approvals.services.parties import (
    party_enrolment_request,
    party_passkey_enrol,
    party_passkey_remove,
)
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.credentials import token_hash
from common.errors import ErrorCode
from harness.webauthn import SoftPasskey

pytestmark = pytest.mark.django_db

HOST = Actor("host", "1", "fleet-a")
STAFF = Actor("user", "7", "sam")


def _events(kind: AuditKind) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind, operation_key="").order_by("id"))


def _enrol(token: str, key: SoftPasskey) -> PartyPasskey:
    return party_passkey_enrol(
        token=token, credential_id=key.id, public_key=key.public_key, name="Phone"
    )


def test_an_enrolment_link_is_stored_only_as_its_hash_and_expires_by_the_setting(settings):
    settings.SETTLE_ENROLMENT_LINK_SECONDS = 600
    enrolment, token = party_enrolment_request(
        host="fleet-a", party="cust_8812", actor=HOST, display_name="Ada"
    )
    assert token.startswith("ste_") and len(token) >= 4 + 43  # 32 random bytes, base64url
    row = PartyEnrolment.objects.get()
    assert row.token_hash == token_hash(token) and token not in row.token_hash
    assert row.expires_at - row.created_at == timedelta(seconds=600)
    assert row.party.display_name == "Ada" and row.requested_by == HOST
    (event,) = _events(AuditKind.PARTY_ENROLMENT_REQUESTED)
    assert event.data["party"] == "cust_8812" and event.data["enrolment_id"] == str(enrolment.id)
    assert token not in str(event.data) and token_hash(token) not in str(event.data)


def test_asking_again_keeps_one_party_row_and_takes_the_newer_name():
    party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST, display_name="Ada")
    party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST, display_name="Ada L.")
    party_enrolment_request(host="fleet-b", party="cust_1", actor=HOST)
    assert Party.objects.get(host="fleet-a", party="cust_1").display_name == "Ada L."
    assert Party.objects.count() == 2


def test_enrolling_adds_the_passkey_and_records_its_public_key():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    key = SoftPasskey()
    passkey = _enrol(token, key)
    assert passkey.party.party == "cust_1" and passkey.removed_at is None
    assert PartyEnrolment.objects.get().used_at is not None
    (event,) = _events(AuditKind.PARTY_PASSKEY_ADDED)
    assert event.data["credential_id"] == key.id
    assert event.data["public_key"] == key.public_key
    assert event.actor.kind == "party" and event.actor.id == str(passkey.party_id)


def test_an_enrolment_link_enrols_one_passkey_only():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    _enrol(token, SoftPasskey())
    with pytest.raises(ApprovalError) as refused:
        _enrol(token, SoftPasskey())
    assert refused.value.code == ErrorCode.ENROLMENT_USED
    assert PartyPasskey.objects.count() == 1
    assert len(_events(AuditKind.PARTY_PASSKEY_ADDED)) == 1


def test_an_expired_or_unknown_enrolment_link_enrols_nothing():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    later = timezone.now() + timedelta(seconds=901)
    with time_machine.travel(later, tick=False), pytest.raises(ApprovalError) as expired:
        _enrol(token, SoftPasskey())
    assert expired.value.code == ErrorCode.ENROLMENT_EXPIRED
    with pytest.raises(ApprovalError) as unknown:
        _enrol(token + "x", SoftPasskey())
    assert unknown.value.code == ErrorCode.ENROLMENT_UNKNOWN
    assert not PartyPasskey.objects.exists()
    assert PartyEnrolment.objects.get().used_at is None


def test_a_passkey_enrolled_already_is_refused_and_the_link_stays_unused():
    key = SoftPasskey()
    _, first = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    _enrol(first, key)
    _, second = party_enrolment_request(host="fleet-a", party="cust_2", actor=HOST)
    with pytest.raises(ApprovalError) as refused:
        _enrol(second, key)
    assert refused.value.code == ErrorCode.REGISTRATION_INVALID
    assert PartyEnrolment.objects.get(token_hash=token_hash(second)).used_at is None


def test_removing_a_passkey_records_it_once():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    passkey = _enrol(token, SoftPasskey())
    removed, changed = party_passkey_remove(party=passkey.party, passkey_id=passkey.pk, actor=STAFF)
    assert changed and removed.removed_at is not None and removed.removed_by == STAFF
    again, changed_again = party_passkey_remove(
        party=passkey.party, passkey_id=passkey.pk, actor=HOST
    )
    assert not changed_again and again.removed_by == STAFF
    (event,) = _events(AuditKind.PARTY_PASSKEY_REMOVED)
    assert event.data["credential_id"] == passkey.credential_id and event.actor == STAFF


def test_a_passkey_of_another_party_cannot_be_removed_through_this_one():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    passkey = _enrol(token, SoftPasskey())
    other = Party.objects.create(host="fleet-b", party="cust_1")
    with pytest.raises(ApprovalError) as refused:
        party_passkey_remove(party=other, passkey_id=passkey.pk, actor=HOST)
    assert refused.value.code == ErrorCode.UNKNOWN_PASSKEY
    assert PartyPasskey.objects.get().removed_at is None


def test_a_failed_enrolment_leaves_no_event_behind():
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=HOST)
    with pytest.raises(RuntimeError), transaction.atomic():
        _enrol(token, SoftPasskey())
        raise RuntimeError("the caller's transaction fails after")
    assert not _events(AuditKind.PARTY_PASSKEY_ADDED)
    assert PartyEnrolment.objects.get().used_at is None
