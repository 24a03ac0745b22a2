"""The status page with a real beat and worker: green while beat sweeps, red once beat is
killed; the worker's sweep timings reach the web process's /metrics (one directory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from recovery.models import Pulse

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "metrics-token-for-the-beat-test"


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.2)


def _beat_ok(client: Client) -> bool | None:
    html = client.get("/status/").content.decode()
    if 'data-check="beat" data-ok="true"' in html:
        return True
    if 'data-check="beat" data-ok="false"' in html:
        return False
    return None


def _sweeps_timed(client: Client) -> float:
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "settle_sweep_duration_seconds_count":
                return sample.value
    return 0.0


def test_the_status_page_goes_red_when_beat_is_killed(
    celery_env: dict[str, str | None], celery_procs: Any, settings: Any
) -> None:
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 3
    settings.SETTLE_METRICS_TOKEN = TOKEN
    client = Client()
    client.force_login(User.objects.create_user("watcher"))
    assert _beat_ok(client) is False  # never swept
    celery_procs("worker", celery_env)
    beat = celery_procs("beat", celery_env)
    _wait(lambda: Pulse.objects.filter(name=Pulse.Name.SWEEP).exists(), 30, "first sweep")
    _wait(lambda: _beat_ok(client) is True, 10, "green beat")
    # The worker's figures, summed here (its start removed those of dead processes).
    swept = _sweeps_timed(client)
    _wait(lambda: _sweeps_timed(client) > swept, 10, "another sweep timed in /metrics")
    assert (
        client.get("/healthz?detail=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()["checks"][
            "beat"
        ]["ok"]
        is True
    )

    beat.kill()  # SIGKILL: no goodbye, the sweeps just stop
    _wait(lambda: _beat_ok(client) is False, 15, "red beat")
    detail = client.get("/healthz?detail=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert detail.status_code == 503
    assert detail.json()["checks"]["beat"]["ok"] is False
