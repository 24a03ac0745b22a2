"""Staff revoke a customer's passkey in the administration: audited like a host's revoke,
with the staff member as actor; it needs the change permission on customer passkeys."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from approvals.models import PartyPasskey
from approvals.services.parties import party_enrolment_request, party_passkey_enrol
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from harness.webauthn import SoftPasskey

pytestmark = pytest.mark.django_db
URL = "/admin/approvals/partypasskey/"


@pytest.fixture
def passkey() -> PartyPasskey:
    _, token = party_enrolment_request(host="fleet-a", party="cust_1", actor=Actor.system("t"))
    key = SoftPasskey()
    return party_passkey_enrol(token=token, credential_id=key.id, public_key=key.public_key)


def _staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="approvals", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def _revoke(client: Client, passkey: PartyPasskey):
    return client.post(URL, {"action": "revoke", "_selected_action": [passkey.pk]})


def test_staff_who_may_change_customer_passkeys_revoke_one(passkey):
    client = _staff("sam", "view_partypasskey", "change_partypasskey")
    assert _revoke(client, passkey).status_code == 302
    passkey.refresh_from_db()
    assert passkey.removed_at is not None and passkey.removed_by.name == "sam"
    event = AuditEvent.objects.get(kind=AuditKind.PARTY_PASSKEY_REMOVED)
    assert event.actor.name == "sam" and event.data["credential_id"] == passkey.credential_id


def test_staff_who_may_only_view_revoke_nothing(passkey):
    client = _staff("viv", "view_partypasskey")
    assert client.get(URL).status_code == 200
    _revoke(client, passkey)
    passkey.refresh_from_db()
    assert passkey.removed_at is None
    assert not AuditEvent.objects.filter(kind=AuditKind.PARTY_PASSKEY_REMOVED).exists()


def test_the_public_key_and_the_enrolment_token_hash_are_not_shown(passkey):
    client = _staff("sam", "view_partypasskey", "view_partyenrolment")
    page = client.get(f"{URL}{passkey.pk}/change/").content.decode()
    assert passkey.public_key not in page
    enrolments = client.get("/admin/approvals/partyenrolment/").content.decode()
    assert "sha256:" not in enrolments
