"""The outbox: rows written with the change they report, in its transaction, for the
subscribed endpoints of the operation's host; a commit nudges a delivery."""

from __future__ import annotations

import json
from typing import Any

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from common.actors import COMMAND_LINE
from recovery import changes
from recovery.models import Operation
from recovery.services.locking import operation_lock
from recovery.transitions import Event, TransitionRefused, operation_transition
from tests.support.webhooks import bodies, released
from webhooks import delivery, outbox
from webhooks.delivery import webhooks_deliver
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = pytest.mark.django_db


def test_a_host_without_endpoints_gets_no_outbox_rows(flow):
    released(flow)
    assert not WebhookMessage.objects.exists()


def test_only_subscribed_events_are_written(flow, host, receiver, allow_private):
    webhook_endpoint_add(
        host_name=host.name, url=receiver.url, events=["operation.released"], actor=COMMAND_LINE
    )
    released(flow)
    assert list(WebhookMessage.objects.values_list("event", flat=True)) == ["operation.released"]


def test_another_hosts_endpoint_gets_nothing(flow, other_host_api, receiver, allow_private):
    webhook_endpoint_add(host_name="fleet-b", url=receiver.url, actor=COMMAND_LINE)
    released(flow)
    assert not WebhookMessage.objects.exists()


def test_a_change_that_rolls_back_leaves_no_message_and_sends_nothing(flow, endpoint, receiver):
    flow.approved()
    flow.dispatch()
    WebhookMessage.objects.all().delete()

    class Boom(Exception):
        pass

    # The message is written by the change's transaction (with its events, on
    # PostgreSQL: ``audit_transaction_rider``), before it commits: here it never does.
    with pytest.raises(Boom), transaction.atomic():
        with audit_transaction():
            operation = operation_lock(Operation.objects.get(key="op-1"))
            operation_transition(operation=operation, event=Event.FAIL, actor=COMMAND_LINE)
        assert WebhookMessage.objects.count() == 1
        raise Boom

    assert not WebhookMessage.objects.exists()
    assert webhooks_deliver(seconds=2).delivered == 0
    assert receiver.received == []


def test_a_refused_transition_writes_no_message(flow, endpoint):
    flow.approved()
    flow.dispatch()
    before = WebhookMessage.objects.count()
    with pytest.raises(TransitionRefused), audit_transaction():
        operation = operation_lock(Operation.objects.get(key="op-1"))
        operation.version -= 1  # read before another change
        operation_transition(operation=operation, event=Event.FAIL, actor=COMMAND_LINE)
    assert WebhookMessage.objects.count() == before


@pytest.mark.django_db(transaction=True)
def test_messages_committed_before_a_crash_of_the_publish_are_sent_later(
    flow, endpoint, receiver, monkeypatch
):
    published: list[str] = []

    def broker_down(*args: Any, **kwargs: Any) -> None:
        published.append(args[0])
        raise ConnectionError("broker down")

    monkeypatch.setattr(outbox.current_app, "send_task", broker_down)
    monkeypatch.setattr(outbox, "_last_nudge", 0.0)
    released(flow)

    assert published  # the nudge was tried after the commit, and failed
    assert WebhookMessage.objects.filter(status="pending").count() == 2
    assert receiver.received == []
    assert webhooks_deliver(seconds=5).delivered == 2  # beat's round
    assert len(receiver.received) == 2


def test_a_message_is_due_at_the_instant_it_was_written(flow, endpoint):
    # The outbox is written by hand-written SQL: its timestamps must compare with the
    # ORM's, to the microsecond, on every database (SQLite stores them as text).
    with time_machine.travel(timezone.now(), tick=False):
        released(flow)
        claimed = delivery.webhook_messages_claim(limit=10)
    # The operation's first message; the others wait behind it, in order.
    first = WebhookMessage.objects.order_by("id").values_list("msg_id", flat=True)[0]
    assert [item.msg_id for item in claimed] == [first]


def test_two_changes_of_one_operation_in_one_transaction_are_written_in_order(flow, endpoint):
    """The first batch rides with the events (PostgreSQL); the second, which must see the
    first's row to wait behind it, is written after them."""
    flow.approved()
    WebhookMessage.objects.all().delete()
    with audit_transaction():
        operation = operation_lock(Operation.objects.get(key="op-1"))
        audit_append(kind="test", operation=operation)  # the events' INSERT they ride with
        for n in (1, 2):
            outbox.webhook_events_record(
                [outbox.OutboxEvent(operation, "operation.released", {"n": n})]
            )
    first, second = WebhookMessage.objects.order_by("id")
    assert [json.loads(m.payload)["data"]["n"] for m in (first, second)] == [1, 2]
    assert first.next_attempt_at is not None and second.next_attempt_at is None


def test_a_message_written_behind_one_waits_and_beat_finds_a_missed_promotion(
    flow, endpoint, receiver
):
    released(flow)  # two messages of op-1: the second waits behind the first
    first, second = WebhookMessage.objects.order_by("id")
    assert first.next_attempt_at is not None and second.next_attempt_at is None
    # As if the first was delivered by a transaction that could not see the second.
    WebhookMessage.objects.filter(pk=first.pk).update(status="delivered")
    assert webhooks_deliver(seconds=2, promote=False).delivered == 0
    assert webhooks_deliver(seconds=2).delivered == 1  # beat's round
    assert json.loads(receiver.received[0].body)["type"] == "operation.released"


def test_a_recovery_reports_the_release_with_its_evidence_and_the_repaired_receipt(
    flow, endpoint, receiver, provider_db
):
    from harness.providers import sqlite_provider_commit
    from recovery.models import Dispatch
    from tests.support.flow import PARAMS

    flow.approved()
    flow.dispatch()
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="ord-9")
    assert flow.resume_looked_up()["recovered"] is True

    webhooks_deliver(seconds=5)
    by_type = {body["type"]: body["data"] for body in bodies(receiver)}
    evidence_id = flow.record()["evidence"][-1]["evidence_id"]
    released_data = by_type["operation.released"]
    assert released_data["recovered"] is True and released_data["evidence_id"] == evidence_id
    assert released_data["verdict"] == "match"
    repaired = by_type["receipt.repaired"]
    assert repaired["receipt_status"] == "succeeded" and repaired["evidence_id"] == evidence_id
    # Nothing for the lease's loss (unknown is not an event hosts subscribe to).
    assert set(by_type) == {"approval.decided", "operation.released", "receipt.repaired"}


def test_an_operation_sent_to_reconcile_is_reported_with_the_reason(
    flow, endpoint, receiver, provider_db
):
    from harness.providers import sqlite_provider_commit
    from recovery.models import Dispatch

    flow.approved()
    flow.dispatch()
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    sqlite_provider_commit(provider_db, operation_key="op-1", params={"other": 1}, reference="x")
    flow.resume_looked_up()
    assert flow.record()["state"] == "reconcile"

    webhooks_deliver(seconds=5)
    [reconcile] = [body for body in bodies(receiver) if body["type"] == "operation.reconcile"]
    assert reconcile["data"]["state"] == "reconcile"
    assert reconcile["data"]["reason"] == "mismatch"


def test_with_no_recorder_registered_a_transition_writes_nothing_to_the_outbox(
    flow, endpoint, monkeypatch
):
    monkeypatch.setattr(changes, "_recorders", [])
    released(flow)
    assert Operation.objects.get(key="op-1").state == "released"
    assert not WebhookMessage.objects.exists()


def test_the_registered_outbox_writes_in_the_transitions_transaction_and_rolls_back_with_it(
    flow, endpoint
):
    assert outbox.outbox_changes_record in changes._recorders  # by WebhooksConfig.ready
    flow.approved()
    flow.dispatch()
    before = WebhookMessage.objects.count()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        with audit_transaction():
            operation = operation_lock(Operation.objects.get(key="op-1"))
            operation_transition(operation=operation, event=Event.FAIL, actor=COMMAND_LINE)
        assert WebhookMessage.objects.filter(event="operation.failed").count() == 1
        raise Boom

    assert WebhookMessage.objects.count() == before
    assert Operation.objects.get(key="op-1").state == "dispatched"
