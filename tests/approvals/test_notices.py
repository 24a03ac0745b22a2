"""Approvers are told of approvals opened, due, escalated and expired: one message per
channel tag per run, posted by Apprise to a real local HTTP server, each channel a
path of it (``json://127.0.0.1:PORT/<tag>``) in an Apprise configuration file."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from approvals.models import Approval, ApprovalNotice
from approvals.notices import NoticesReport, approval_notices_run
from audit.models import AuditEvent
from common.actors import COMMAND_LINE
from recovery.models import Operation
from recovery.selectors.records import operations_params_canonical
from tests.support.apprise_receiver import Receiver
from tests.support.flow import Flow
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

CONSOLE = "https://settle.example.com"
TAGS = ("approvers", "payments", "supervisors")


@pytest.fixture
def notify_config(settings: Any, receiver: Receiver, tmp_path: Path) -> Path:
    """Channels for three tags, each a path of the receiver; the console's address."""
    lines = [f"  - json://127.0.0.1:{receiver.port}/{tag}:\n      tag: {tag}" for tag in TAGS]
    config = tmp_path / "approval-notify.yml"
    config.write_text("urls:\n" + "\n".join(lines) + "\n")
    settings.SETTLE_APPROVAL_NOTIFY_CONFIG = str(config)
    settings.SETTLE_CONSOLE_URL = CONSOLE
    return config


def opened(flow: Flow, key: str, **fields: Any) -> Approval:
    """An approval opened through the host API; its policy's fields set by the test (the
    policy code that fills them is not this feature's)."""
    flow.register(key)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals")
    assert response.status_code in (200, 201), response.content
    approval_id = response.json()["approval_id"]
    if fields:
        Approval.objects.filter(pk=approval_id).update(**fields)
    return Approval.objects.get(pk=approval_id)


def notices_run() -> NoticesReport:
    """A run as beat's task makes one, the operations' parameters read from recovery."""
    return approval_notices_run(params_of=operations_params_canonical)


def link(approval: Approval) -> str:
    return f"{CONSOLE}/approvals/{approval.id}/"


def by_tag(receiver: Receiver) -> dict[str, dict[str, Any]]:
    """The posts since the last take, by the tag of the channel each went to; one each."""
    posts = receiver.take_by_path()
    tags = [path.strip("/") for path, _ in posts]
    assert len(tags) == len(set(tags)), f"more than one message to a tag: {tags}"
    return {path.strip("/"): post for path, post in posts}


def later(minutes: float) -> Any:
    return time_machine.travel(timezone.now() + timedelta(minutes=minutes), tick=True)


@pytest.mark.django_db
def test_an_opened_approval_is_announced_once_with_a_link_to_it(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    approval = opened(flow, "op-1")
    report = notices_run()
    assert (report.approvals_claimed, report.delivered) == (1, 1)
    message = by_tag(receiver)["approvers"]  # no groups: the tag "approvers"
    assert message["title"] == "Settle approvals: 1 waiting"
    assert message["message"].splitlines() == [
        "Waiting for a decision:",
        "- payment.send on orders for fleet-a",
        "  amount=1250, currency=EUR, to=acct-7",
        f"  {link(approval)}",
    ]
    approval.refresh_from_db()
    assert approval.notified_at is not None and approval.reminded_at is None
    notices_run()
    assert receiver.take() == []  # once


@pytest.mark.django_db
def test_a_burst_of_approvals_is_one_message_per_tag(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    approvals = [
        opened(flow, f"op-{n}", notify_groups=["payments", "approvers"] if n % 2 else [])
        for n in range(20)
    ]
    notices_run()
    messages = by_tag(receiver)
    assert set(messages) == {"approvers", "payments"}
    assert messages["approvers"]["title"] == "Settle approvals: 20 waiting"
    assert messages["payments"]["title"] == "Settle approvals: 10 waiting"
    for n, approval in enumerate(approvals):
        assert link(approval) in messages["approvers"]["message"]
        assert (link(approval) in messages["payments"]["message"]) == bool(n % 2)


@pytest.mark.django_db
def test_a_reminder_goes_once_after_the_remind_time(
    flow: Flow, receiver: Receiver, notify_config: Path, settings: Any
):
    settings.SETTLE_APPROVAL_REMIND_MINUTES = 15
    default = opened(flow, "op-1")  # no remind_at: 15 minutes after it opened
    own = opened(flow, "op-2", remind_at=timezone.now() + timedelta(minutes=5))
    notices_run()
    assert by_tag(receiver)["approvers"]["title"] == "Settle approvals: 2 waiting"
    with later(6):
        notices_run()
        reminder = by_tag(receiver)["approvers"]
        assert reminder["title"] == "Settle approvals: 1 still waiting"
        assert link(own) in reminder["message"] and link(default) not in reminder["message"]
    with later(16):
        notices_run()
        reminder = by_tag(receiver)["approvers"]
        assert reminder["title"] == "Settle approvals: 1 still waiting"
        assert link(default) in reminder["message"]
    with later(40):
        notices_run()
        assert receiver.take() == []  # one reminder each


@pytest.mark.django_db
def test_escalation_goes_to_the_escalation_tags_only_once_due(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    far = timezone.now() + timedelta(hours=5)
    escalating = opened(
        flow,
        "op-1",
        notify_groups=["payments"],
        escalate_groups=["supervisors"],
        escalate_at=timezone.now() + timedelta(minutes=30),
        remind_at=far,
    )
    quiet = opened(flow, "op-2", remind_at=far)  # no escalation groups: never escalates
    notices_run()
    assert set(by_tag(receiver)) == {"payments", "approvers"}
    with later(29):
        notices_run()
        assert receiver.take() == []
    with later(61):  # past the default escalation time too
        notices_run()
        messages = by_tag(receiver)
        assert set(messages) == {"supervisors"}
        assert messages["supervisors"]["title"] == "Settle approvals: 1 escalated"
        assert link(escalating) in messages["supervisors"]["message"]
    quiet.refresh_from_db()
    assert quiet.escalated_at is None


@pytest.mark.django_db
def test_an_expired_approval_expires_its_operation_tells_the_host_and_its_approvers(
    flow: Flow, receiver: Receiver, notify_config: Path, settings: Any, host: Any
):
    from recovery import tasks

    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    webhook_endpoint_add(host_name=host.name, url="http://127.0.0.1:9/hooks", actor=COMMAND_LINE)
    approval = opened(
        flow,
        "op-1",
        notify_groups=["payments"],
        expires_at=timezone.now() + timedelta(minutes=10),
        remind_at=timezone.now() + timedelta(minutes=10),
    )
    notices_run()
    assert set(by_tag(receiver)) == {"payments"}
    with later(11):
        assert tasks.sweep()["approvals_expired"] == 1  # beat's sweep expires it
        approval.refresh_from_db()
        assert approval.status == "expired"
        assert Operation.objects.get(key="op-1").state == "expired"
        assert AuditEvent.objects.filter(operation_key="op-1", kind="approval_expired").exists()
        [decided] = WebhookMessage.objects.filter(operation__key="op-1", event="approval.decided")
        assert json.loads(decided.payload)["data"]["decision"] == "expired"
        notices_run()
        messages = by_tag(receiver)
        assert set(messages) == {"payments"}  # no reminder: it expired
        assert messages["payments"]["title"] == "Settle approvals: 1 expired"
        assert link(approval) in messages["payments"]["message"]
        notices_run()
        assert receiver.take() == []


@pytest.mark.django_db
def test_an_undelivered_message_is_recorded_and_sent_again(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    approval = opened(flow, "op-1")
    receiver.status = 500
    assert notices_run().delivered == 0
    notice = ApprovalNotice.objects.get()
    assert "could not deliver to tag 'approvers'" in notice.send_error
    assert (notice.status, notice.attempts, notice.claimed_until) == ("pending", 1, None)
    receiver.status = 200
    assert notices_run().delivered == 1
    message = by_tag(receiver)["approvers"]
    assert message["title"] == "Settle approvals: 1 waiting"
    assert link(approval) in message["message"]
    notice.refresh_from_db()
    assert (notice.status, notice.send_error, notice.attempts) == ("sent", "", 2)


@pytest.mark.django_db
def test_beats_task_is_the_run(flow: Flow, receiver: Receiver, notify_config: Path):
    from monitoring import tasks

    opened(flow, "op-1")
    opened(flow, "op-2", notify_groups=["payments"])
    assert tasks.approval_notices() == 2  # messages delivered: one per tag
    assert tasks.approval_notices() == 0
    assert set(by_tag(receiver)) == {"approvers", "payments"}


@pytest.mark.django_db
def test_a_message_undelivered_for_a_day_is_dropped(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    opened(flow, "op-1", remind_at=timezone.now() + timedelta(days=2))
    receiver.status = 500
    notices_run()
    receiver.status = 200
    with later(24 * 60 + 1):
        notices_run()
        assert receiver.take() == []
    notice = ApprovalNotice.objects.get()
    assert notice.status == "dropped" and "could not deliver" in notice.send_error


@pytest.mark.django_db
def test_news_of_an_approval_decided_meanwhile_is_dropped(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    opened(flow, "op-1")
    receiver.status = 500
    notices_run()
    flow.approve("op-1")  # decided before the opening message got through
    receiver.status = 200
    notices_run()
    assert receiver.take() == []
    assert ApprovalNotice.objects.get().status == "dropped"


@pytest.mark.django_db
def test_without_a_configuration_nothing_is_claimed_or_sent(
    flow: Flow, receiver: Receiver, settings: Any
):
    settings.SETTLE_APPROVAL_NOTIFY_CONFIG = ""
    opened(flow, "op-1", expires_at=timezone.now() - timedelta(minutes=1))
    opened(flow, "op-2")
    report = notices_run()
    assert (report.approvals_claimed, report.messages) == (0, [])
    from recovery.services.approval_expiry import approvals_expire

    assert len(approvals_expire(now=timezone.now(), limit=10)) == 1
    assert not ApprovalNotice.objects.exists()
    assert set(Approval.objects.values_list("notified_at", flat=True)) == {None}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("held", ["approvals_approval", "monitoring_approvalnotice"])
def test_a_run_never_sends_what_a_run_in_flight_holds(
    flow: Flow, receiver: Receiver, notify_config: Path, held: str
):
    """Run A stops right after it read and locked its rows (the approvals it claims, or
    the notices it takes), on a connection of its own; run B goes all the way meanwhile.
    Each message still goes once."""
    approvals = [opened(flow, f"op-{n}", notify_groups=["payments"]) for n in range(5)]
    if held == "monitoring_approvalnotice":
        # Claimed and written by an earlier run whose message did not go out.
        receiver.status = 500
        notices_run()
        receiver.status = 200
    b_done = threading.Event()
    a_holds = threading.Event()
    errors: list[BaseException] = []

    def pause(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        # Its first read of ``held``: the one that takes the rows.
        if held in sql and sql.lstrip().startswith("SELECT") and not a_holds.is_set():
            a_holds.set()
            b_done.wait(timeout=10)
        return result

    def run_a() -> None:
        try:
            with connection.execute_wrapper(pause):
                notices_run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    a = threading.Thread(target=run_a)
    a.start()
    assert a_holds.wait(timeout=10)
    notices_run()  # run B, on this thread's connection
    b_done.set()
    a.join(timeout=30)
    assert errors == []
    bodies = [post["message"] for post in receiver.take()]
    assert len(bodies) == 1
    for approval in approvals:
        assert bodies[0].count(link(approval)) == 1
    assert ApprovalNotice.objects.filter(status="sent").count() == len(approvals)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_never_send_one_message_twice(
    flow: Flow, receiver: Receiver, notify_config: Path
):
    """Two runs on two connections, released together, round after round."""
    errors: list[BaseException] = []

    def run(start: threading.Barrier) -> None:
        try:
            start.wait(timeout=10)
            notices_run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    approvals = []
    for round_ in range(3):
        approvals += [
            opened(flow, f"op-{round_}-{n}", notify_groups=["payments"]) for n in range(30)
        ]
        start = threading.Barrier(2)
        runners = [threading.Thread(target=run, args=(start,)) for _ in range(2)]
        for runner in runners:
            runner.start()
        for runner in runners:
            runner.join(timeout=60)
        assert errors == []
    bodies = [post["message"] for post in receiver.take()]
    for approval in approvals:
        assert sum(body.count(link(approval)) for body in bodies) == 1, link(approval)
    assert ApprovalNotice.objects.filter(status="sent").count() == len(approvals)


@pytest.mark.django_db
def test_an_undelivered_message_shows_its_error_in_the_admin(
    flow: Flow, receiver: Receiver, notify_config: Path, client: Any
):
    from django.contrib.auth.models import User

    opened(flow, "op-1")
    receiver.status = 500
    notices_run()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw-tests"))
    notice = ApprovalNotice.objects.get()
    assert client.get("/admin/approvals/approvalnotice/").status_code == 200
    page = client.get(f"/admin/approvals/approvalnotice/{notice.pk}/change/")
    assert page.status_code == 200 and "could not deliver to tag" in page.content.decode()
