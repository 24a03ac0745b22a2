"""Audit alarms in the console: a red banner on every page for supervisors, resolved on
the record.

The alarm comes from a real checkpoint over a chain rewritten as a forger with SQL
access would (``tests/audit/test_audit_chain.py`` covers what a checkpoint finds).
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from audit.alarms import audit_alarms_open
from audit.chain import audit_append, audit_transaction
from audit.checkpoints import audit_checkpoint
from audit.models import AuditAlarm, AuditEvent
from audit.seal_verify import _checkpoints_verified
from audit.verify_walk import _alarms_disagree
from common.actors import Actor
from console.services.audit_trail import audit_alarm_resolve
from recovery.models import Operation
from recovery.services.errors import Invalid, RecoveryError
from recovery.services.locking import operation_lock
from tests.support.audit import chain_forge
from tests.support.console import client_for, console_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def alarm(stuck) -> AuditAlarm:
    operation = stuck.unknown("pay-forged")
    audit_checkpoint()
    chain_forge(operation.key)
    stuck.unknown("pay-other")
    with audit_transaction():  # the operation moves on, over the rewritten head
        locked = operation_lock(Operation.objects.get(key=operation.key))
        audit_append(kind="test", operation=locked)
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and checkpoint.broken
    return AuditAlarm.objects.get()


@pytest.mark.parametrize("page", ["/", "/reconciliations/", "/audit/"])
def test_supervisors_see_the_red_banner_on_every_page(alarm, supervisor, page):
    body = client_for(supervisor).get(page).content.decode()
    assert "data-audit-alarms" in body and "Audit log broken." in body
    assert f"checkpoint #{alarm.checkpoint} refused to sign" in body
    assert "pay-forged" in body


def test_the_banner_is_on_the_operation_page_too(alarm, supervisor):
    body = client_for(supervisor).get("/operations/pay-other/").content.decode()
    assert "data-audit-alarms" in body


@pytest.mark.parametrize("who", ["operator", "viewer"])
def test_operators_and_viewers_see_no_banner(alarm, request, who):
    body = client_for(request.getfixturevalue(who)).get("/").content.decode()
    assert "data-audit-alarms" not in body


def test_no_banner_without_an_open_alarm(stuck, supervisor):
    stuck.unknown("pay-fine")
    audit_checkpoint()
    assert "data-audit-alarms" not in client_for(supervisor).get("/").content.decode()


def test_a_supervisor_resolves_it_and_the_banner_goes(alarm, supervisor):
    client = client_for(supervisor)
    page = client.get("/audit/").content.decode()
    assert f'data-alarm="{alarm.pk}"' in page
    response = client.post(
        f"/audit/alarms/{alarm.pk}/resolve", {"resolution": "restored from last night's backup"}
    )
    assert response.status_code == 302 and response["Location"] == "/audit/#alarms"
    alarm.refresh_from_db()
    assert not alarm.open and alarm.resolution == "restored from last night's backup"
    event = AuditEvent.objects.get(kind="audit_alarm_resolved")
    assert event.actor is not None and event.actor.name == supervisor.username
    assert "data-audit-alarms" not in client.get("/").content.decode()


# Transactional: the checkpoints reach their file, which the verification reads, only
# when their transaction commits.
@pytest.mark.django_db(transaction=True)
def test_a_supervisor_resolves_an_alarm_on_the_record(alarm, supervisor, operator):
    """The service itself (``audit_alarm_resolve``): who may, what is refused, and a
    resolution the full verification agrees was made on the record."""
    sam = Actor.of("user", supervisor)
    with pytest.raises(RecoveryError) as refused:
        audit_alarm_resolve(
            actor=Actor.of("user", operator), alarm_id=alarm.pk, resolution="looked"
        )
    assert refused.value.code == "forbidden"
    with pytest.raises(Invalid, match="say what was done"):
        audit_alarm_resolve(actor=sam, alarm_id=alarm.pk, resolution="  ")

    audit_alarm_resolve(actor=sam, alarm_id=alarm.pk, resolution="restored from backup")

    alarm.refresh_from_db()
    assert not alarm.open and alarm.resolved_by is not None
    assert alarm.resolved_by.name == supervisor.username
    event = AuditEvent.objects.get(kind="audit_alarm_resolved")
    assert event.operation_key == "" and event.data["alarm"] == alarm.pk
    assert _alarm_problems() == []
    with pytest.raises(Invalid, match="resolved already"):
        audit_alarm_resolve(actor=sam, alarm_id=alarm.pk, resolution="again")


def _alarm_problems() -> list[str]:
    """What the full verification finds wrong with the alarms."""
    checkpointed, problem = _checkpoints_verified()
    assert problem is None
    return [str(found) for found in _alarms_disagree(checkpointed.broken)]


def test_an_empty_resolution_is_refused_with_a_message(alarm, supervisor):
    client = client_for(supervisor)
    response = client.post(f"/audit/alarms/{alarm.pk}/resolve", {"resolution": " "}, follow=True)
    assert "Not resolved: say what was done about it." in response.content.decode()
    alarm.refresh_from_db()
    assert alarm.open


def test_an_operator_may_not_resolve(alarm, operator):
    response = client_for(operator).post(
        f"/audit/alarms/{alarm.pk}/resolve", {"resolution": "nothing"}
    )
    assert response.status_code == 403
    alarm.refresh_from_db()
    assert alarm.open


def test_resolving_an_unknown_alarm_is_404(alarm, supervisor):
    response = client_for(supervisor).post("/audit/alarms/999999/resolve", {"resolution": "x"})
    assert response.status_code == 404


def test_resolve_needs_post_sign_in_and_csrf(alarm, supervisor):
    url = f"/audit/alarms/{alarm.pk}/resolve"
    assert client_for(supervisor).get(url).status_code == 405
    anonymous = client_for(None).post(url, {"resolution": "x"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert (
        client_for(supervisor, csrf_checks=True).post(url, {"resolution": "x"}).status_code == 403
    )
    alarm.refresh_from_db()
    assert alarm.open


def test_a_superusers_banner_shows_the_five_newest_open_alarms(db):
    at = timezone.now()
    for n in range(8):
        AuditAlarm.objects.create(
            chain=f"op-{n}",
            seq=n + 1,
            reason="rewritten",
            checkpoint=1,
            raised_at=at - timedelta(minutes=n % 3),  # ties: the id decides
            resolved_at=at if n in (2, 5) else None,
            signature="x",
        )
    expected = [alarm.chain for alarm in audit_alarms_open()[:5]]
    assert expected == ["op-6", "op-3", "op-0", "op-7", "op-4"]
    root = User.objects.create_superuser("root", password="x")
    body = client_for(root).get("/").content.decode()
    banner = body[body.index("data-audit-alarms") :]
    shown = re.findall(r'<code class="wrap">(op-\d)</code>', banner[: banner.index("</div>")])
    assert shown == expected


def test_a_supervisor_of_another_provider_neither_sees_nor_resolves_its_alarm(
    alarm, other_provider
):
    elsewhere = client_for(console_user("lena", "supervisor", other_provider))
    for page in ("/", "/audit/"):
        body = elsewhere.get(page).content.decode()
        assert "pay-forged" not in body and "data-audit-alarms" not in body
        assert f'data-alarm="{alarm.pk}"' not in body
    response = elsewhere.post(f"/audit/alarms/{alarm.pk}/resolve", {"resolution": "not mine"})
    assert response.status_code == 404
    alarm.refresh_from_db()
    assert alarm.open


def test_the_system_chains_alarm_is_every_supervisors(alarm, supervisor, other_provider):
    system = AuditAlarm.objects.create(
        chain="", seq=3, reason="rewritten", checkpoint=2, raised_at=timezone.now(), signature="x"
    )
    elsewhere = client_for(console_user("lena", "supervisor", other_provider))
    body = elsewhere.get("/").content.decode()
    assert "the system chain" in body and "pay-forged" not in body
    assert client_for(supervisor).get("/").content.decode().count("refused to sign") == 2
    response = elsewhere.post(f"/audit/alarms/{system.pk}/resolve", {"resolution": "restored"})
    assert response.status_code == 302
    system.refresh_from_db()
    assert not system.open
