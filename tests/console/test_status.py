"""The status page and /healthz?detail=1: each check green, or red past its threshold."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit.checkpoints import audit_checkpoint
from common.actors import COMMAND_LINE
from recovery.models import Operation, Pulse
from recovery.services.runs import pulse_record
from tests.support.console import Stuck, client_for
from webhooks.endpoints import webhook_endpoint_add, webhook_endpoint_disable
from webhooks.models import WebhookMessage


def fresh_sweep(seconds_ago: float = 1) -> None:
    pulse_record(
        name=Pulse.Name.SWEEP, seconds=0.1, at=timezone.now() - timedelta(seconds=seconds_ago)
    )


TOKEN = "metrics-token-for-the-status-tests"


@pytest.fixture(autouse=True)
def _metrics_token(settings: Any) -> None:
    """The detail answers the bearer of the metrics token (tests/console/test_healthz_access)."""
    settings.SETTLE_METRICS_TOKEN = TOKEN


def detail(client: Client) -> tuple[int, dict[str, Any]]:
    response = client.get("/healthz?detail=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return response.status_code, response.json()


def test_plain_healthz_keeps_its_answer(db: None, client: Client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": connection.vendor}


def test_detail_is_green_when_beat_swept_lately(db: None, client: Client):
    fresh_sweep()
    status, body = detail(client)
    assert status == 200, body
    assert body["ok"] is True
    assert set(body["checks"]) == {
        "database",
        "broker",
        "beat",
        "workers",
        "webhook deliveries",
        "audit checkpoint",
        "audit verification",
        "audit alarms",
    }
    assert all(check["ok"] for check in body["checks"].values())
    assert body["checks"]["beat"]["at"] is not None


def test_detail_is_red_and_503_when_beat_never_swept(db: None, client: Client):
    status, body = detail(client)
    assert status == 503
    assert body["ok"] is False
    assert body["checks"]["beat"] == {
        "ok": False,
        "detail": "last sweep never (red after 60 s)",
        "at": None,
    }


def test_beat_goes_red_past_its_threshold(db: None, client: Client, settings):
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 30
    fresh_sweep(seconds_ago=29)
    assert detail(client)[1]["checks"]["beat"]["ok"] is True
    fresh_sweep(seconds_ago=31)
    status, body = detail(client)
    assert status == 503 and body["checks"]["beat"]["ok"] is False


def test_workers_go_red_when_a_due_lookup_waits_too_long(stuck: Stuck, client: Client, settings):
    settings.SETTLE_STATUS_LOOKUP_LAG_SECONDS = 120
    fresh_sweep()
    stuck.unknown("op-1")
    assert detail(client)[1]["checks"]["workers"]["ok"] is True
    Operation.objects.filter(key="op-1").update(
        next_lookup_at=timezone.now() - timedelta(minutes=3)
    )
    status, body = detail(client)
    assert status == 503
    assert body["checks"]["workers"]["ok"] is False
    assert "has waited 18" in body["checks"]["workers"]["detail"]


def test_webhook_deliveries_go_red_when_a_due_message_waits_for_no_worker(
    flow: Any, host: Any, client: Client, settings
):
    settings.SETTLE_STATUS_WEBHOOK_LAG_SECONDS = 120
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    fresh_sweep()
    endpoint, _ = webhook_endpoint_add(
        host_name=host.name, url="http://127.0.0.1:9/hooks", actor=COMMAND_LINE
    )
    flow.approved()  # one message, due now: nobody runs the webhook queue's worker here
    check = detail(client)[1]["checks"]["webhook deliveries"]
    assert check["ok"] is True and check["detail"].startswith("1 pending;")
    message = WebhookMessage.objects.filter(pk=WebhookMessage.objects.get().pk)
    three_minutes_ago = timezone.now() - timedelta(minutes=3)
    message.update(next_attempt_at=three_minutes_ago)
    status, body = detail(client)
    assert status == 503
    check = body["checks"]["webhook deliveries"]
    assert check["ok"] is False
    assert "has waited 18" in check["detail"]
    assert settings.SETTLE_WEBHOOK_QUEUE in check["detail"]

    # A worker holds it (a live claim): it is being delivered, not waiting.
    message.update(lease_expires_at=timezone.now() + timedelta(minutes=1))
    assert detail(client)[1]["checks"]["webhook deliveries"]["ok"] is True
    # Its claim lapsed: waiting again.
    message.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert detail(client)[1]["checks"]["webhook deliveries"]["ok"] is False
    # Retried later after an error (back-off): not due, not waiting for a worker.
    message.update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert detail(client)[1]["checks"]["webhook deliveries"]["ok"] is True
    # A disabled endpoint's messages wait by design.
    message.update(next_attempt_at=three_minutes_ago)
    webhook_endpoint_disable(endpoint_id=endpoint.pk, actor=COMMAND_LINE)
    assert detail(client)[1]["checks"]["webhook deliveries"]["ok"] is True


def test_checkpoint_goes_red_when_events_wait_unsigned_too_long(
    stuck: Stuck, client: Client, settings
):
    fresh_sweep()
    stuck.unknown("op-1")  # audit events, and no checkpoint yet
    settings.SETTLE_STATUS_CHECKPOINT_STALE_SECONDS = 60
    assert detail(client)[1]["checks"]["audit checkpoint"]["ok"] is True
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        status, body = detail(client)
    assert status == 503
    assert body["checks"]["audit checkpoint"]["ok"] is False
    audit_checkpoint()
    assert detail(client)[1]["checks"]["audit checkpoint"]["ok"] is True


def test_the_status_page_needs_a_signed_in_user(db: None, client: Client):
    response = client.get("/status/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("user", ["viewer", "operator", "outsider"])
def test_the_status_page_shows_every_check_to_any_signed_in_user(user: str, request):
    signed_in = client_for(request.getfixturevalue(user))
    fresh_sweep()
    page = signed_in.get("/status/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-check="beat" data-ok="true"' in html
    assert "All checks green." in html
    assert 'aria-current="page">Status</a>' in html


def test_the_status_page_turns_red_and_htmx_gets_only_the_checks(viewer, settings):
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 10
    fresh_sweep(seconds_ago=11)
    client = client_for(viewer)
    html = client.get("/status/").content.decode()
    assert 'data-check="beat" data-ok="false"' in html
    assert "Something needs attention." in html
    partial = client.get("/status/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<section id="status-checks"')
    assert 'data-check="beat" data-ok="false"' in partial


def test_a_log_never_verified_and_not_due_says_so_rather_than_never_in_green(
    db: None, client: Client
):
    fresh_sweep()
    check = detail(client)[1]["checks"]["audit verification"]
    assert check["ok"] is True
    assert "never" not in check["detail"]
    assert check["detail"].startswith("not verified yet, and not due")


@pytest.mark.parametrize(("ago", "ok"), [(29, True), (31, False)])
def test_the_status_page_and_livez_judge_beat_by_one_threshold(
    db: None, client: Client, settings, ago, ok
):
    """Beat that published and finished its last sweep ``ago`` seconds back is late on
    both or on neither: ``SETTLE_LIVENESS_BEAT_SECONDS`` is the one threshold."""
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 30
    fresh_sweep(seconds_ago=ago)
    pulse_record(name=Pulse.Name.BEAT, seconds=0.0, at=timezone.now() - timedelta(seconds=ago))
    beat_line = detail(client)[1]["checks"]["beat"]
    livez = client.get("/livez").json()
    assert beat_line["ok"] is ok
    assert ("beat" not in livez.get("silent", {})) is ok
