"""Credential lifecycle: hosts and approvers disabled, enabled and rotated, audited.

Each change takes effect on the credential's very next request to the process that made
it; on the others within ``SETTLE_CREDENTIAL_CACHE_SECONDS`` (``test_token_cache.py``).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command

from approvals.models import Approver
from audit.models import AuditEvent
from common.actors import COMMAND_LINE, Actor
from recovery.models import Host
from recovery.services.credentials import credential_disable, credential_rotate

pytestmark = pytest.mark.django_db
ROOT = Actor("user", "1", "root")


def _lists(api) -> int:
    """Any authenticated host call; its status says whether the token is accepted."""
    return api.get("/api/v1/operations/nothing-here").status_code


def _decides(api) -> int:
    response = api.post(
        "/api/v1/approvals/00000000-0000-0000-0000-000000000000/decision",
        {"decision": "approve", "params_digest": "sha256:" + "0" * 64},
    )
    return response.status_code


def test_a_disabled_host_is_refused_from_its_next_request_and_can_be_enabled(host_api):
    assert _lists(host_api) == 404  # authenticated: the operation does not exist
    credential_disable(kind="host", name="fleet-a", actor=ROOT)
    assert _lists(host_api) == 401
    assert host_api.get("/api/v1/operations/x").json()["error"] == "unauthorized"
    credential_disable(kind="host", name="fleet-a", actor=ROOT, disabled=False)
    assert _lists(host_api) == 404
    kinds = list(AuditEvent.objects.filter(operation_key="").values_list("kind", "data__name"))
    assert ("credential_disabled", "fleet-a") in kinds
    assert ("credential_enabled", "fleet-a") in kinds


def test_a_rotated_host_token_replaces_the_old_one_at_once(host_api):
    token = credential_rotate(kind="host", name="fleet-a", actor=ROOT)
    assert _lists(host_api) == 401
    host_api.token = token
    assert _lists(host_api) == 404
    event = AuditEvent.objects.get(kind="credential_rotated")
    assert event.data == {"credential": "host", "id": Host.objects.get().pk, "name": "fleet-a"}
    assert token not in str(event.data)


def test_a_disabled_or_rotated_approver_is_refused(approver_api):
    assert _decides(approver_api) == 404  # authenticated: no such approval
    credential_disable(kind="approver", name="alice-phone", actor=COMMAND_LINE)
    assert _decides(approver_api) == 401
    credential_disable(kind="approver", name="alice-phone", actor=COMMAND_LINE, disabled=False)
    approver_api.token, old = (
        credential_rotate(kind="approver", name="alice-phone", actor=COMMAND_LINE),
        approver_api.token,
    )
    assert approver_api.token.startswith("sta_")
    assert _decides(approver_api) == 404
    approver_api.token = old
    assert _decides(approver_api) == 401


def test_the_credential_command_disables_enables_and_rotates(host_api, capsys):
    call_command("credential", "disable", "host", "fleet-a")
    assert "host fleet-a disabled" in capsys.readouterr().out
    assert _lists(host_api) == 401
    call_command("credential", "enable", "host", "fleet-a")
    call_command("credential", "rotate", "host", "fleet-a")
    host_api.token = capsys.readouterr().out.strip().splitlines()[-1]
    assert _lists(host_api) == 404
    with pytest.raises(CommandError, match="no host named 'ghost'"):
        call_command("credential", "disable", "host", "ghost")


@pytest.fixture
def admin_client(client):
    # force_login: django-axes needs the request that only a real sign-in carries.
    client.force_login(
        User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    )
    return client


def test_admin_actions_disable_and_rotate_and_never_delete(admin_client, host_api, approver_api):
    host = Host.objects.get()
    response = admin_client.post(
        "/admin/recovery/host/", {"action": "disable", "_selected_action": [host.pk]}
    )
    assert response.status_code == 302
    assert _lists(host_api) == 401
    response = admin_client.post(
        "/admin/recovery/host/", {"action": "rotate", "_selected_action": [host.pk]}
    )
    (message,) = [
        m.message for m in get_messages(response.wsgi_request) if "shown once" in m.message
    ]
    host_api.token = message.rsplit(": ", 1)[1]
    admin_client.post("/admin/recovery/host/", {"action": "enable", "_selected_action": [host.pk]})
    assert _lists(host_api) == 404
    approver = Approver.objects.get()
    assert admin_client.get(f"/admin/approvals/approver/{approver.pk}/delete/").status_code == 403
    assert admin_client.get(f"/admin/recovery/host/{host.pk}/delete/").status_code == 403
    actors = set(
        AuditEvent.objects.filter(kind__startswith="credential_").values_list("actor", flat=True)
    )
    assert actors == {Actor.of("user", User.objects.get(username="root"))}
