"""What each attempt leaves behind: retries with back-off, giving up, an endpoint failing,
disabled by 410 or back, a lapsed claim, and the counters."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from tests.support.webhooks import released
from webhooks import delivery, outcomes, send
from webhooks.delivery import webhooks_deliver
from webhooks.models import WebhookEndpoint, WebhookMessage

pytestmark = pytest.mark.django_db


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


def test_delivery_outcomes_are_counted_and_the_backlog_is_scraped(
    flow, endpoint, receiver, client, settings, django_capture_on_commit_callbacks
):
    from tests.support.monitoring import TOKEN, samples

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
