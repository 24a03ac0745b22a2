"""Delivery to a real receiver (verifying with ``standardwebhooks``): signed, retried with
the same id, in order, under a hard deadline, and a slow receiver delays no other."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from common.actors import COMMAND_LINE
from recovery.models import Operation
from tests.support.webhook_receiver import trickling_serve
from tests.support.webhooks import bodies, released
from webhooks import delivery, outcomes, send
from webhooks.delivery import webhooks_deliver
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = pytest.mark.django_db


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


def test_the_address_is_checked_again_at_delivery(flow, endpoint, receiver, settings):
    flow.approved()
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = False  # as if the name now resolved inside
    assert webhooks_deliver(seconds=2).failed == 1
    assert receiver.received == []
    assert WebhookMessage.objects.get().last_error.startswith("private_webhook_url")


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
