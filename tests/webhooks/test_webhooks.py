"""Webhooks to hosts: the outbox written with the change, signed delivery to a real
receiver (verifying with ``standardwebhooks``), retries, order, rotation and refusals."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from approvals.actors import COMMAND_LINE
from recovery import changes
from recovery.audit import audit_transaction
from recovery.models import Operation
from recovery.services.errors import Invalid
from recovery.services.locking import operation_lock
from recovery.transitions import Event, TransitionRefused, operation_transition
from tests.conftest import Flow
from tests.support.webhook_receiver import (
    Receiver,
    Silent,
    receiver_serve,
    silent_serve,
    trickling_serve,
)
from webhooks import delivery, outbox, outcomes, send
from webhooks.delivery import webhooks_deliver
from webhooks.endpoints import webhook_endpoint_add, webhook_endpoint_rotate, webhook_url_addresses
from webhooks.models import WebhookEndpoint, WebhookMessage

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def silent() -> Iterator[Silent]:
    yield from silent_serve()


@pytest.fixture
def allow_private(settings: Any) -> None:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True


@pytest.fixture
def endpoint(host: Any, receiver: Receiver, allow_private: None) -> WebhookEndpoint:
    added, secret = webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    return added


def released(flow: Flow, key: str = "op-1") -> None:
    flow.approved(key)
    token = flow.dispatch(key).json()["fencing_token"]
    response = flow.host_api.post(
        f"/api/v1/operations/{key}/result", {"fencing_token": token, "outcome": "committed"}
    )
    assert response.status_code == 200, response.content


def bodies(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(item.body) for item in receiver.received]


def test_a_release_is_delivered_signed_naming_key_state_and_version(flow, endpoint, receiver):
    released(flow)

    assert webhooks_deliver(seconds=5).delivered == 2
    assert [body["type"] for body in bodies(receiver)] == [
        "approval.decided",
        "operation.released",
    ]
    item = receiver.received[1]
    assert all(item.verified.values()) and item.verified
    data = json.loads(item.body)["data"]
    assert data["operation"] == "op-1" and data["state"] == "released"
    assert data["version"] == Operation.objects.get(key="op-1").version
    assert data["recovered"] is False
    token_hint = ("fencing", "token", "secret", "whsec")
    assert not any(word in item.body.decode() for word in token_hint)
    message = WebhookMessage.objects.get(msg_id=item.id)
    assert message.status == "delivered" and message.attempts == 1
    assert message.last_status_code == 204


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

    with pytest.raises(Boom), audit_transaction():
        operation = operation_lock(Operation.objects.get(key="op-1"))
        operation_transition(operation=operation, event=Event.FAIL, actor=COMMAND_LINE)
        assert WebhookMessage.objects.count() == 1
        raise Boom

    assert not WebhookMessage.objects.exists()
    assert webhooks_deliver(seconds=2).delivered == 0
    assert receiver.received == []


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

    with pytest.raises(Boom), audit_transaction():
        operation = operation_lock(Operation.objects.get(key="op-1"))
        operation_transition(operation=operation, event=Event.FAIL, actor=COMMAND_LINE)
        assert WebhookMessage.objects.filter(event="operation.failed").count() == 1
        raise Boom

    assert WebhookMessage.objects.count() == before
    assert Operation.objects.get(key="op-1").state == "dispatched"


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


def test_a_failed_attempt_is_retried_later_with_the_same_webhook_id(flow, endpoint, receiver):
    flow.approved()
    receiver.statuses = [503]
    assert webhooks_deliver(seconds=2).failed == 1
    message = WebhookMessage.objects.get()
    assert message.status == "pending" and message.attempts == 1
    assert message.last_status_code == 503
    wait = (message.next_attempt_at - message.last_attempt_at).total_seconds()
    assert 3.75 <= wait <= 6.25  # five seconds, jittered by a quarter
    assert webhooks_deliver(seconds=2).delivered == 0  # not due yet

    with time_machine.travel(timezone.now() + timedelta(seconds=10)):
        assert webhooks_deliver(seconds=2).delivered == 1
    first, second = receiver.received
    assert first.id == second.id == message.msg_id
    assert second.body == first.body


def test_an_endpoint_that_times_out_is_sent_nothing_more_that_round_and_the_others_are(
    flow, host, endpoint, receiver, silent, settings
):
    settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS = 1
    hanging, _ = webhook_endpoint_add(host_name=host.name, url=silent.url, actor=COMMAND_LINE)
    for n in range(20):
        flow.approved(f"op-{n}")  # approval.decided, to both endpoints
    to_hanging = WebhookMessage.objects.filter(endpoint=hanging)

    report = webhooks_deliver(seconds=30)
    # Only the requests under way when the first timed out reached the silent receiver;
    # the good endpoint's twenty went out in the same round.
    assert silent.accepted <= send.DELIVERY_THREADS < 20
    assert report.delivered == 20 and len(receiver.received) == 20
    assert report.failed == silent.accepted and report.deferred == 20 - silent.accepted
    timed_out = list(to_hanging.filter(attempts=1))
    deferred = list(to_hanging.filter(attempts=0))
    assert len(timed_out) == silent.accepted and len(deferred) == report.deferred
    assert all("Timeout" in message.last_error for message in timed_out)
    assert all(message.lease_expires_at is None for message in timed_out + deferred)
    # The timed-out ones probe the receiver on their own back-off; the rest wait for the
    # endpoint's errors in a row (longer), not due in the next rounds.
    hanging.refresh_from_db()
    assert hanging.failures == silent.accepted
    assert min(m.next_attempt_at for m in deferred) > max(m.next_attempt_at for m in timed_out)
    with time_machine.travel(timezone.now() + timedelta(seconds=30)):
        accepted = silent.accepted
        webhooks_deliver(seconds=30)
        assert silent.accepted - accepted <= len(timed_out)  # the probes, nothing deferred
    assert to_hanging.filter(attempts=0).count() == len(deferred)


def test_back_off_doubles_and_is_jittered():
    waits = [outcomes.backoff_seconds(n) for n in range(1, 8)]
    for n, wait in enumerate(waits, start=1):
        base = 5 * 2 ** (n - 1)
        assert base * 0.75 <= wait <= base * 1.25
    assert outcomes.backoff_seconds(30) <= 3600 * 1.25


def test_a_message_is_given_up_only_after_the_retry_window(flow, endpoint, receiver, settings):
    flow.approved()
    receiver.status = 500
    start = timezone.now()
    with time_machine.travel(start + timedelta(hours=23), tick=False):
        WebhookMessage.objects.update(next_attempt_at=timezone.now())
        webhooks_deliver(seconds=2)
        assert WebhookMessage.objects.get().status == "pending"
    with time_machine.travel(start + timedelta(hours=24, minutes=1), tick=False):
        WebhookMessage.objects.update(next_attempt_at=timezone.now())
        webhooks_deliver(seconds=2)
        assert WebhookMessage.objects.get().status == "failed"


def test_repeated_errors_mark_the_endpoint_failing_and_a_success_clears_it(
    flow, endpoint, receiver, settings
):
    settings.SETTLE_WEBHOOK_FAILING_AFTER = 3
    flow.approved()
    receiver.status = 500
    for _ in range(3):
        WebhookMessage.objects.update(next_attempt_at=timezone.now())
        webhooks_deliver(seconds=2)
    endpoint.refresh_from_db()
    assert endpoint.status == "failing" and endpoint.failures == 3

    receiver.status = 200
    WebhookMessage.objects.update(next_attempt_at=timezone.now())
    assert webhooks_deliver(seconds=2).delivered == 1
    endpoint.refresh_from_db()
    assert endpoint.status == "enabled" and endpoint.failures == 0


def test_a_receiver_answering_410_disables_its_endpoint(flow, endpoint, receiver):
    receiver.status = 410
    released(flow)
    webhooks_deliver(seconds=2)
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled" and "410" in endpoint.disabled_reason
    WebhookMessage.objects.update(next_attempt_at=timezone.now())
    receiver.status = 200
    assert webhooks_deliver(seconds=2).delivered == 0  # a disabled endpoint gets nothing
    assert len(receiver.received) == 1


def test_a_redirect_is_not_followed(flow, endpoint, receiver):
    receiver.statuses = [302]
    receiver.headers_out = {"location": "http://127.0.0.1:9/elsewhere"}
    flow.approved()
    assert webhooks_deliver(seconds=2).failed == 1
    assert [item.path for item in receiver.received] == ["/hooks"]
    assert WebhookMessage.objects.get().last_status_code == 302


def test_messages_of_one_operation_are_delivered_in_order(flow, endpoint, receiver):
    released(flow)  # approval.decided, then operation.released
    flow.approved("op-2")
    receiver.by_operation = {"op-1": [503]}  # op-1's first message fails once
    webhooks_deliver(seconds=2)
    # op-1's second message waits behind its first; op-2's is delivered meanwhile.
    assert WebhookMessage.objects.filter(operation__key="op-2").get().status == "delivered"
    first = WebhookMessage.objects.filter(event="approval.decided", operation__key="op-1").get()
    assert first.attempts == 1 and first.status == "pending"
    assert WebhookMessage.objects.filter(event="operation.released").get().attempts == 0

    WebhookMessage.objects.filter(status="pending").update(next_attempt_at=timezone.now())
    webhooks_deliver(seconds=2)
    op1 = [body["type"] for body in bodies(receiver) if body["data"]["operation"] == "op-1"]
    assert op1 == ["approval.decided", "approval.decided", "operation.released"]
    assert not WebhookMessage.objects.exclude(status="delivered").exists()


def test_a_lapsed_claim_is_delivered_again(flow, endpoint, receiver, settings):
    flow.approved()
    claimed = delivery.webhook_messages_claim(limit=10)
    assert len(claimed) == 1
    assert delivery.webhook_messages_claim(limit=10) == []  # held by the claim
    with time_machine.travel(timezone.now() + timedelta(seconds=121)):
        assert webhooks_deliver(seconds=2).delivered == 1
    # The first claim's worker, back from the dead, records nothing over it.
    outcomes.webhook_outcomes_record([send.Outcome(claimed[0], 500)])
    assert WebhookMessage.objects.get().status == "delivered"


def test_after_a_rotation_both_secrets_verify_until_the_grace_ends(flow, endpoint, receiver):
    old = receiver.secrets[0]
    new = webhook_endpoint_rotate(
        endpoint_id=endpoint.pk, actor=COMMAND_LINE, grace=timedelta(hours=1)
    )
    receiver.secrets.append(new)
    assert new.startswith("whsec_") and new != old
    flow.approved()
    webhooks_deliver(seconds=2)
    assert receiver.received[-1].verified == {old: True, new: True}

    with time_machine.travel(timezone.now() + timedelta(hours=1, seconds=5)):
        flow.approved("op-2")
        webhooks_deliver(seconds=2)
    assert receiver.received[-1].verified == {old: False, new: True}


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "http:///no-host",
        "http://user:pw@example.com/hook",
    ],
)
def test_a_url_that_is_not_http_with_a_host_is_refused(url):
    with pytest.raises(Invalid) as refused:
        webhook_url_addresses(url)
    assert refused.value.code == "invalid_webhook_url"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://172.16.5.4/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/hook",
        "http://[::ffff:127.0.0.1]/hook",
    ],
)
def test_an_address_on_this_machine_or_a_private_network_is_refused(url, host):
    with pytest.raises(Invalid) as refused:
        webhook_endpoint_add(host_name=host.name, url=url, actor=COMMAND_LINE)
    assert refused.value.code == "private_webhook_url"
    assert "SETTLE_WEBHOOKS_ALLOW_PRIVATE" in refused.value.message
    assert not WebhookEndpoint.objects.exists()


def test_the_address_is_checked_again_at_delivery(flow, endpoint, receiver, settings):
    flow.approved()
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = False  # as if the name now resolved inside
    assert webhooks_deliver(seconds=2).failed == 1
    assert receiver.received == []
    assert WebhookMessage.objects.get().last_error.startswith("private_webhook_url")


def test_unknown_events_are_refused(host, receiver, allow_private):
    with pytest.raises(Invalid) as refused:
        webhook_endpoint_add(
            host_name=host.name, url=receiver.url, events=["op.exploded"], actor=COMMAND_LINE
        )
    assert refused.value.code == "invalid_webhook_events"


def test_the_webhook_command_adds_lists_rotates_and_disables(host, receiver, allow_private):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command(
        "webhook", "add", host.name, receiver.url, "--events", "operation.failed", stdout=out
    )
    secret = out.getvalue().split("shown once): ")[1].strip()
    assert secret.startswith("whsec_")
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ",operation.failed,"

    out = StringIO()
    call_command("webhook", "list", stdout=out)
    assert receiver.url in out.getvalue() and "operation.failed" in out.getvalue()
    assert secret not in out.getvalue()  # write-only

    out = StringIO()
    call_command("webhook", "rotate", str(endpoint.pk), stdout=out)
    endpoint.refresh_from_db()
    assert endpoint.previous_secret == secret and endpoint.secret in out.getvalue()

    call_command("webhook", "disable", str(endpoint.pk), stdout=StringIO())
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled"

    with pytest.raises(CommandError, match="invalid_webhook_url"):
        call_command("webhook", "add", host.name, "gopher://x", stdout=StringIO())


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
    from recovery.models import Dispatch
    from tests.conftest import PARAMS
    from tests.support.providers import sqlite_provider_commit

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
    from recovery.models import Dispatch
    from tests.support.providers import sqlite_provider_commit

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


def test_delivery_outcomes_are_counted_and_the_backlog_is_scraped(
    flow, endpoint, receiver, client, settings, django_capture_on_commit_callbacks
):
    from tests.console.test_metrics import TOKEN, samples

    settings.SETTLE_METRICS_TOKEN = TOKEN
    flow.approved()

    def scraped(name: str, **labels: str) -> float:
        return samples(client).get((name, tuple(sorted(labels.items()))), 0.0)

    assert scraped("settle_webhook_outbox_backlog") == 1
    waiting = WebhookMessage.objects.filter(status="pending")
    waiting.update(next_attempt_at=timezone.now() - timedelta(minutes=10))
    assert 600 <= scraped("settle_webhook_delivery_lag_seconds") < 660  # no worker took it
    waiting.update(next_attempt_at=timezone.now())
    retrying = scraped("settle_webhook_deliveries_total", outcome="retrying")
    delivered = scraped("settle_webhook_deliveries_total", outcome="delivered")
    receiver.statuses = [503]
    with django_capture_on_commit_callbacks(execute=True):
        assert webhooks_deliver(seconds=2).failed == 1
    assert scraped("settle_webhook_deliveries_total", outcome="retrying") >= retrying + 1
    assert scraped("settle_webhook_outbox_backlog") == 1  # a retry still waits

    later = timezone.now() + timedelta(seconds=10)
    with time_machine.travel(later), django_capture_on_commit_callbacks(execute=True):
        assert webhooks_deliver(seconds=2).delivered == 1
    assert scraped("settle_webhook_deliveries_total", outcome="delivered") >= delivered + 1
    assert scraped("settle_webhook_outbox_backlog") == 0
    assert scraped("settle_webhook_delivery_lag_seconds") == 0


def test_a_message_is_due_at_the_instant_it_was_written(flow, endpoint):
    # The outbox is written by hand-written SQL: its timestamps must compare with the
    # ORM's, to the microsecond, on every database (SQLite stores them as text).
    with time_machine.travel(timezone.now(), tick=False):
        released(flow)
        claimed = delivery.webhook_messages_claim(limit=10)
    # The operation's first message; the others wait behind it, in order.
    first = WebhookMessage.objects.order_by("id").values_list("msg_id", flat=True)[0]
    assert [item.msg_id for item in claimed] == [first]


def test_a_receiver_that_trickles_its_answer_holds_a_delivery_no_longer_than_the_timeout(
    flow, host, allow_private, settings
):
    # Each byte comes well within httpx's read timeout; only the whole-request bound
    # (SETTLE_WEBHOOK_TIMEOUT_SECONDS) stops the wait. Its status is the outcome.
    settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS = 1
    with trickling_serve(every=0.2) as url:
        webhook_endpoint_add(host_name=host.name, url=url, actor=COMMAND_LINE)
        flow.approved("op-1")
        began = time.monotonic()
        report = webhooks_deliver(seconds=30)
        took = time.monotonic() - began
    assert report.delivered == 1
    assert took < 5, took


def test_a_receiver_that_trickles_its_headers_is_cut_off_at_the_deadline(
    flow, host, allow_private, settings
):
    # "HTTP/1.1 200 OK", then a header byte every 0.2 s: every read is well within
    # httpx's own timeout, so only the whole exchange's deadline can end it.
    settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS = 1
    with trickling_serve(every=0.2, head=True) as url:
        webhook_endpoint_add(host_name=host.name, url=url, actor=COMMAND_LINE)
        flow.approved("op-1")
        (claimed,) = delivery.webhook_messages_claim(limit=10)
        outcomes: list[send.Outcome] = []
        with send.webhook_client() as client:
            sender = threading.Thread(
                target=lambda: outcomes.append(
                    send.webhook_message_send(claimed, client, send.webhook_target(url))
                ),
                daemon=True,
            )
            began = time.monotonic()
            sender.start()
            sender.join(timeout=5)  # bounded: on a build without the deadline it never ends
            took = time.monotonic() - began
    assert outcomes, f"the send was still waiting on the trickling receiver after {took:.1f} s"
    (outcome,) = outcomes
    assert outcome.timed_out and outcome.status_code is None, outcome
    assert took < 2, took


def test_each_outcome_is_recorded_as_it_arrives_not_after_the_slowest(
    flow, host, endpoint, receiver, silent, settings, monkeypatch
):
    settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS = 2
    hanging, _ = webhook_endpoint_add(host_name=host.name, url=silent.url, actor=COMMAND_LINE)
    for n in range(3):
        flow.approved(f"op-{n}")  # approval.decided, to both endpoints
    recorded: list[tuple[float, list[send.Outcome]]] = []
    record = outcomes.webhook_outcomes_record
    began = time.monotonic()

    def spy(outcomes):
        recorded.append((time.monotonic() - began, list(outcomes)))
        record(outcomes)

    monkeypatch.setattr(delivery, "webhook_outcomes_record", spy)
    report = webhooks_deliver(seconds=10)
    assert report.delivered == 3 and len(receiver.received) == 3
    good = [
        (at, outcome)
        for at, outcomes in recorded
        for outcome in outcomes
        if outcome.claimed.endpoint_id == endpoint.pk
    ]
    # The good endpoint's outcomes were committed while the silent one's were still
    # waiting for their deadline, not together with them at its end.
    assert len(good) == 3 and all(outcome.delivered for _, outcome in good)
    assert max(at for at, _ in good) < 1.5, recorded
    slow = WebhookMessage.objects.filter(endpoint=hanging, attempts=1)
    assert slow.exists() and all("Timeout" in message.last_error for message in slow)


def test_a_delivery_starts_no_send_after_its_time(flow, host, allow_private, silent, settings):
    # Twenty endpoints that never answer, one message each: eight threads, a 1 s
    # deadline. A task that starts sends for 0.5 s sends one wave; the rest are released
    # unsent, due at once and no attempt counted, instead of holding it for three waves.
    settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS = 1
    for n in range(20):
        webhook_endpoint_add(host_name=host.name, url=f"{silent.url}/{n}", actor=COMMAND_LINE)
    flow.approved("op-1")
    began = time.monotonic()
    report = webhooks_deliver(seconds=0.5)
    took = time.monotonic() - began
    assert took < 2, took
    assert silent.accepted == report.failed == send.DELIVERY_THREADS
    unsent = WebhookMessage.objects.filter(attempts=0)
    assert unsent.count() == 20 - send.DELIVERY_THREADS
    assert all(m.lease_expires_at is None and m.next_attempt_at <= timezone.now() for m in unsent)


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a00:1",  # NAT64's well-known prefix around 10.0.0.1
        "64:ff9b::7f00:1",  # … around 127.0.0.1
        "64:ff9b:1::a00:1",  # the local-use NAT64 prefix, a network's own
        "64:ff9b:1:ffff::808:808",
        "::a00:1",  # IPv4-compatible ::10.0.0.1
        "::7f00:1",  # ::127.0.0.1
        "::ffff:a00:1",  # IPv4-mapped ::ffff:10.0.0.1
        "::ffff:a9fe:a9fe",  # ::ffff:169.254.169.254
        "fec0::1",  # site-local
        "feff:ffff::1",
        "2002:a00:1::1",  # 6to4 around 10.0.0.1
        "2002:7f00:1::",  # 6to4 around 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 around 169.254.169.254
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    ],
)
def test_an_ipv6_address_around_a_private_one_or_in_a_private_range_is_refused(address):
    with pytest.raises(Invalid) as refused:
        webhook_url_addresses(f"http://[{address}]/hook")
    assert refused.value.code == "private_webhook_url"


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "[2606:4700:4700::1111]",
        "[2a00:1450:4001:82b::200e]",
        "[64:ff9b::808:808]",  # NAT64 around 8.8.8.8: a public address, reached from IPv6
        "[2002:808:808::1]",  # 6to4 around 8.8.8.8
        "[::ffff:808:808]",
    ],
)
def test_a_public_address_passes_the_check(address):
    _, addresses = webhook_url_addresses(f"http://{address}/hook")
    assert addresses


def test_a_message_refused_just_now_keeps_its_back_off_when_another_succeeds(flow, endpoint):
    # Outcomes are recorded as they arrive: a 503 for one message and a 204 for the next,
    # a moment apart, must not read as a receiver that was down (failing) and is back.
    flow.approved("op-1")
    flow.approved("op-2")
    refused, accepted = sorted(delivery.webhook_messages_claim(limit=10), key=lambda c: c.id)
    outcomes.webhook_outcomes_record([send.Outcome(refused, 503)])
    outcomes.webhook_outcomes_record([send.Outcome(accepted, 204)])
    message = WebhookMessage.objects.get(pk=refused.id)
    assert message.attempts == 1 and message.next_attempt_at > timezone.now()
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).failures == 0


def test_a_failing_endpoints_first_success_brings_its_waiting_messages_forward(
    flow, endpoint, settings
):
    settings.SETTLE_WEBHOOK_FAILING_AFTER = 2
    for n in range(3):
        flow.approved(f"op-{n}")
    first, second, third = sorted(delivery.webhook_messages_claim(limit=10), key=lambda c: c.id)
    outcomes.webhook_outcomes_record([send.Outcome(first, None, "ConnectError")])
    outcomes.webhook_outcomes_record([send.Outcome(second, None, "ConnectError")])
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).status == "failing"
    outcomes.webhook_outcomes_record([send.Outcome(third, 204)])
    waiting = WebhookMessage.objects.filter(pk__in=[first.id, second.id])
    assert all(message.next_attempt_at <= timezone.now() for message in waiting)
