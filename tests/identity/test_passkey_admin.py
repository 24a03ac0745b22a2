"""A superuser removes a lost passkey in the administration: recorded like any removal,
with the superuser as actor and the owner in the data; nobody adds or edits one there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from allauth.mfa.models import Authenticator
from django.contrib.auth.models import User
from django.test import Client

from audit.kinds import AuditKind
from audit.models import AuditEvent
from identity.passkeys import passkey_credential

pytestmark = pytest.mark.django_db

# A registration Chromium's virtual authenticator made (test_passkeys_browser.py).
REGISTRATION = json.loads(
    (Path(__file__).parent / "data" / "passkey_registration.json").read_text()
)


@pytest.fixture
def passkey(operator) -> Authenticator:
    return Authenticator.objects.create(
        user=operator, type=Authenticator.Type.WEBAUTHN, data=REGISTRATION
    )


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


def test_superuser_removes_a_passkey_and_it_is_on_the_audit_log(
    superuser_client, passkey, operator
):
    url = f"/admin/mfa/authenticator/{passkey.pk}/delete/"
    assert superuser_client.get(url).status_code == 200
    assert superuser_client.post(url, {"post": "yes"}).status_code == 302
    assert not Authenticator.objects.filter(pk=passkey.pk).exists()
    event = AuditEvent.objects.get(kind=AuditKind.PASSKEY_REMOVED)
    assert event.actor.name == "root"
    assert event.data == {
        "user": operator.username,
        "user_id": operator.pk,
        "authenticator_id": passkey.pk,
        "name": "Work laptop",
        "credential_id": passkey_credential(passkey)["credential_id"],
    }


def test_removing_several_at_once_records_each(superuser_client, passkey, operator):
    other = Authenticator.objects.create(
        user=operator, type=Authenticator.Type.WEBAUTHN, data={**REGISTRATION, "name": "Spare"}
    )
    response = superuser_client.post(
        "/admin/mfa/authenticator/",
        {"action": "delete_selected", "_selected_action": [passkey.pk, other.pk], "post": "yes"},
    )
    assert response.status_code == 302
    removed = AuditEvent.objects.filter(kind=AuditKind.PASSKEY_REMOVED).order_by("id")
    assert sorted(e.data["authenticator_id"] for e in removed) == sorted([passkey.pk, other.pk])


def test_passkeys_are_neither_added_nor_edited_in_the_administration(superuser_client, passkey):
    assert superuser_client.get("/admin/mfa/authenticator/add/").status_code == 403
    edit = superuser_client.post(f"/admin/mfa/authenticator/{passkey.pk}/change/", {})
    assert edit.status_code == 403
    passkey.refresh_from_db()
    assert passkey.data == REGISTRATION
    assert superuser_client.get("/admin/mfa/authenticator/").status_code == 200


def test_passkey_credential_is_the_registrations_public_key(passkey):
    credential = passkey_credential(passkey)
    assert credential["credential_id"] == REGISTRATION["credential"]["id"]
    assert credential["public_key"]
