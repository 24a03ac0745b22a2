"""Webhooks in a real browser: an operator finds an endpoint, its deliveries, and
redelivers one that failed.

The deliveries are real: a receiver on this machine answers, ``webhooks_deliver`` sends
and records; time-machine starts them a day ago so that the retry window runs out.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from playwright.sync_api import Page, expect

from common.actors import COMMAND_LINE
from tests.support.browser import screenshots_everywhere, sign_in
from tests.support.webhook_receiver import Receiver, receiver_serve
from webhooks.delivery import webhooks_deliver
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage, webhook_url_redacted

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def deliveries(flow, host, receiver, settings) -> WebhookMessage:
    """A day ago an endpoint was added, one approval delivered to it and another refused
    by the receiver; tried again now, after the retry window, and refused again: given up."""
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    with time_machine.travel(timezone.now() - timedelta(hours=24, minutes=1)):
        _, secret = webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=COMMAND_LINE)
        receiver.secrets.append(secret)
        flow.approved("pay-2026-000201")
        assert webhooks_deliver(seconds=5).delivered == 1
        receiver.status = 500
        flow.approved("pay-2026-000202")
        assert webhooks_deliver(seconds=5).failed == 1
    WebhookMessage.objects.filter(status="pending").update(next_attempt_at=timezone.now())
    assert webhooks_deliver(seconds=5).failed == 1
    failed = WebhookMessage.objects.get(status="failed")
    assert failed.operation.key == "pay-2026-000202" and failed.attempts == 2
    return failed


def test_an_operator_redelivers_a_failed_delivery_and_sees_it_pending(
    page: Page, operator, deliveries
):
    endpoint = deliveries.endpoint
    sign_in(page, "olivia")
    page.get_by_role("link", name="Webhooks").click()
    row = page.locator("[data-webhook-endpoints] tbody tr")
    expect(row).to_have_count(1)
    shown = webhook_url_redacted(endpoint.url)  # an operator may not configure endpoints
    expect(row).to_contain_text(shown)
    expect(row).not_to_contain_text(endpoint.url)
    expect(row).to_contain_text("fleet-a")
    screenshots_everywhere(page, "webhooks")

    row.get_by_role("link", name=shown).click()
    expect(page.locator("h1")).to_have_text("Webhook deliveries")
    delivered = page.locator("[data-webhook-deliveries] tbody tr", has_text="pay-2026-000201")
    failed = page.locator(f"#delivery-{deliveries.pk}")
    expect(delivered.locator(".badge")).to_have_text("delivered")
    expect(failed.locator(".badge")).to_have_text("failed")
    expect(failed).to_contain_text("HTTP 500")
    expect(failed).to_contain_text(deliveries.msg_id)
    screenshots_everywhere(page, "webhook-deliveries")

    failed.get_by_role("button", name="Redeliver").click()
    notice = page.locator(".notice.success")
    expect(notice).to_contain_text(f"Queued again: approval.decided {deliveries.msg_id}")
    expect(page.locator(f"#delivery-{deliveries.pk} .badge")).to_have_text("pending")
    deliveries.refresh_from_db()
    assert deliveries.status == "pending" and deliveries.attempts == 2
    screenshots_everywhere(page, "webhook-redelivered")
