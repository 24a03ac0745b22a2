"""Credentials and providers are reachable in the Django admin, through the same services."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages

from approvals.models import Approver
from approvals.services import token_hash
from recovery.models import AuditEvent, Host, Provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    client.login(username="root", password="pw-for-tests-only")
    return client


def _token_from_messages(response) -> str:
    (message,) = [
        m.message for m in get_messages(response.wsgi_request) if "shown once" in m.message
    ]
    return message.rsplit(": ", 1)[1]


def test_adding_a_host_in_the_admin_shows_its_token_once(admin_client):
    response = admin_client.post("/admin/recovery/host/add/", {"name": "fleet-z"})
    assert response.status_code == 302
    token = _token_from_messages(response)
    assert Host.objects.get(name="fleet-z").token_hash == token_hash(token)


def test_adding_an_approver_in_the_admin_shows_its_token_once(admin_client):
    response = admin_client.post("/admin/approvals/approver/add/", {"name": "desk"})
    token = _token_from_messages(response)
    assert Approver.objects.get(name="desk").token_hash == token_hash(token)


def test_provider_saved_in_the_admin_is_configured_and_audited(admin_client, tmp_path):
    response = admin_client.post(
        "/admin/recovery/provider/add/",
        {
            "name": "ledger",
            "adapter": "journal",
            "path": str(tmp_path / "j.jsonl"),
            "url": "",
            "secret": "",
            "timeout_seconds": "3",
            "lease_seconds": "30",
            "lookup_budget": "4",
        },
    )
    assert response.status_code == 302
    provider = Provider.objects.get(name="ledger")
    assert (provider.lease_seconds, provider.lookup_budget) == (30, 4)
    event = AuditEvent.objects.get(kind="provider_configured")
    assert event.actor == "user:root"


def test_evidence_and_audit_are_read_only_in_the_admin(admin_client):
    assert admin_client.get("/admin/recovery/auditevent/").status_code == 200
    assert admin_client.get("/admin/recovery/auditevent/add/").status_code == 403
    assert admin_client.get("/admin/recovery/evidence/add/").status_code == 403
