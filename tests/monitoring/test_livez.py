"""/livez: beat and the workers of each queue judged from the rows they write themselves;
the same figures as gauges on /metrics."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from monitoring.models import QueuePulse
from monitoring.services.pulses import queue_pulse_record
from recovery.models import Pulse
from recovery.services.runs import pulse_record

TOKEN = "metrics-token-for-the-livez-tests"


def seen(settings: Any, *, beat: float | None, lookups: float | None, webhooks: float | None):
    """Beat and the two queues' workers last seen that many seconds ago (None: never)."""
    now = timezone.now()
    if beat is not None:
        pulse_record(name=Pulse.Name.BEAT, seconds=0.0, at=now - timedelta(seconds=beat))
    for queue, ago in (
        (settings.CELERY_TASK_DEFAULT_QUEUE, lookups),
        (settings.SETTLE_WEBHOOK_QUEUE, webhooks),
    ):
        if ago is not None:
            queue_pulse_record(queue=queue, waited=0.01)
            QueuePulse.objects.filter(queue=queue).update(at=now - timedelta(seconds=ago))


@pytest.fixture
def limits(settings: Any) -> Any:
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 60
    settings.SETTLE_LIVENESS_WORKER_SECONDS = 120
    return settings


def test_livez_is_503_naming_everything_never_seen(db: None, client: Client, limits):
    response = client.get("/livez")
    assert response.status_code == 503
    assert response.json() == {
        "ok": False,
        "silent": {
            "beat": "never seen",
            "lookup workers": "never seen",
            "webhook workers": "never seen",
        },
    }
    assert response["Cache-Control"] == "no-store"


def test_livez_is_200_when_beat_and_every_queue_were_seen_lately(db: None, client: Client, limits):
    seen(limits, beat=5, lookups=20, webhooks=100)
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"ok": True}


def test_livez_names_only_what_is_late_and_by_how_much(db: None, client: Client, limits):
    seen(limits, beat=100, lookups=20, webhooks=200)
    response = client.get("/livez")
    assert response.status_code == 503
    assert response.json() == {
        "ok": False,
        "silent": {"beat": "late by 40 s", "webhook workers": "late by 80 s"},
    }


def test_a_queue_pulse_of_another_queue_does_not_count(db: None, client: Client, limits):
    seen(limits, beat=1, lookups=1, webhooks=None)
    queue_pulse_record(queue="some-other-deployment-webhooks", waited=0)
    assert client.get("/livez").json()["silent"] == {"webhook workers": "never seen"}


def test_one_queue_for_both_is_one_line(db: None, client: Client, limits):
    limits.SETTLE_WEBHOOK_QUEUE = limits.CELERY_TASK_DEFAULT_QUEUE
    seen(limits, beat=1, lookups=None, webhooks=None)
    assert client.get("/livez").json() == {"ok": False, "silent": {"workers": "never seen"}}


def test_livez_reveals_no_queue_and_opens_no_broker_connection(
    db: None, client: Client, limits, monkeypatch
):
    from settle.celery import app

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("/livez opened a broker connection")

    for name in ("connection_for_write", "connection_for_read", "connection"):
        monkeypatch.setattr(app, name, refused)
    seen(limits, beat=500, lookups=500, webhooks=500)
    text = client.get("/livez").content.decode()
    for secret in (
        limits.CELERY_TASK_DEFAULT_QUEUE,
        limits.SETTLE_WEBHOOK_QUEUE,
        "broker",
        "redis",
    ):
        assert secret not in text


def test_healthz_stays_200_while_livez_is_503(db: None, client: Client, limits):
    assert client.get("/livez").status_code == 503
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": connection.vendor}


def gauges(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_the_signs_of_life_are_gauges_on_metrics(db: None, client: Client, limits):
    limits.SETTLE_METRICS_TOKEN = TOKEN
    lookups = (("queue", limits.CELERY_TASK_DEFAULT_QUEUE), ("role", "lookups"))
    webhooks = (("queue", limits.SETTLE_WEBHOOK_QUEUE), ("role", "webhooks"))
    found = gauges(client)
    assert found[("settle_beat_last_seen_seconds", ())] == math.inf
    assert found[("settle_worker_last_seen_seconds", lookups)] == math.inf
    assert found[("settle_liveness_beat_threshold_seconds", ())] == 60
    assert found[("settle_liveness_worker_threshold_seconds", ())] == 120
    assert ("settle_audit_verification_age_seconds", ()) not in found  # never verified
    assert found[("settle_audit_unsigned_oldest_age_seconds", ())] == 0
    seen(limits, beat=30, lookups=50, webhooks=70)
    found = gauges(client)
    assert 30 <= found[("settle_beat_last_seen_seconds", ())] < 40
    assert 50 <= found[("settle_worker_last_seen_seconds", lookups)] < 60
    assert 70 <= found[("settle_worker_last_seen_seconds", webhooks)] < 80


def test_beat_records_its_pulse_when_it_publishes_a_sweep_only(transactional_db: None, limits):
    # Transactional: beat, outside any transaction, drops an unusable connection first.
    from settle.celery import _beat_published

    _beat_published(sender="audit.tasks.audit_checkpoint")
    assert not Pulse.objects.filter(name=Pulse.Name.BEAT).exists()
    _beat_published(sender="recovery.tasks.sweep")
    pulse = Pulse.objects.get(name=Pulse.Name.BEAT)
    assert (timezone.now() - pulse.at).total_seconds() < 5
