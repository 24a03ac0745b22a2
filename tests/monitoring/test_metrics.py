"""/metrics: Prometheus's format, parsed with prometheus-client's own parser; the token.

The counters live in the machine's multiprocess directory, which parallel test processes
share: counter checks compare before and after with ``>=`` or use labels no other test
makes.
"""

from __future__ import annotations

import hmac
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from monitoring.services.pulses import operation_counts_refresh
from recovery.models import Operation, Pulse
from recovery.services.runs import pulse_record
from tests.support.console import Stuck, aged
from tests.support.monitoring import TOKEN, samples, scrape


@pytest.fixture
def token(settings: Any) -> str:
    settings.SETTLE_METRICS_TOKEN = TOKEN
    return TOKEN


def test_metrics_do_not_exist_without_a_token_configured(db: None, client: Client, settings):
    settings.SETTLE_METRICS_TOKEN = ""
    assert scrape(client).status_code == 404
    assert scrape(client, token=None).status_code == 404


def test_a_missing_or_wrong_token_is_refused_with_401(db: None, client: Client, token: str):
    for given in (None, "", TOKEN[:-1], TOKEN + "x", token.upper()):
        response = scrape(client, token=given)
        assert response.status_code == 401, given
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"settle_" not in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401


def test_the_token_is_compared_in_constant_time(db: None, client: Client, token: str, monkeypatch):
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr("console.views.system.hmac.compare_digest", spy)
    assert scrape(client, token="wrong").status_code == 401
    assert scrape(client).status_code == 200
    expected = f"Bearer {TOKEN}".encode()
    assert compared == [(b"Bearer wrong", expected), (expected, expected)]


def test_operations_by_state_are_live_for_stuck_states_and_snapshotted_for_terminal(
    stuck: Stuck, client: Client, token: str
):
    aged(stuck.unknown("op-unknown"), minutes=7)
    stuck.mismatch("op-reconcile")
    stuck.released("op-released")
    before = samples(client)
    orders = (("provider", "orders"),)
    assert before[("settle_operations", (*orders, ("state", "unknown")))] == 1
    assert before[("settle_operations", (*orders, ("state", "reconcile")))] == 1
    # Terminal states come only from beat's snapshot: none taken yet.
    assert ("settle_operations", (*orders, ("state", "released"))) not in before
    assert ("settle_operation_counts_age_seconds", ()) not in before

    assert operation_counts_refresh() == 3
    after = samples(client)
    assert after[("settle_operations", (*orders, ("state", "released")))] == 1
    assert after[("settle_operation_counts_age_seconds", ())] < 60
    oldest = after[("settle_stuck_oldest_age_seconds", (*orders, ("state", "unknown")))]
    assert 7 * 60 <= oldest < 8 * 60
    assert after[("settle_lookups_unavailable_seconds", orders)] == 0


def test_lookups_are_counted_by_verdict_and_timed(stuck: Stuck, client: Client, token: str):
    key = ("settle_lookups_total", (("provider", "orders"), ("verdict", "absent")))
    timed = ("settle_lookup_duration_seconds_count", (("provider", "orders"),))
    before = samples(client)
    stuck.unknown("op-1")  # one lookup: the provider has no record yet
    after = samples(client)
    assert after[key] >= before.get(key, 0) + 1
    assert after[timed] >= before.get(timed, 0) + 1
    assert after[("settle_lookup_last_age_seconds", ())] < 60


def test_host_api_requests_are_counted_by_route_and_status(db: None, client: Client, token):
    endpoint = "/api/v1/operations/<str:key>/resume"
    key = (
        "settle_host_api_requests_total",
        (("endpoint", endpoint), ("method", "POST"), ("status", "401")),
    )
    before = samples(client).get(key, 0)
    for name in ("a-1", "b-2"):  # two keys, one series
        assert client.post(f"/api/v1/operations/{name}/resume").status_code == 401
    after = samples(client)
    assert after[key] >= before + 2
    assert not [
        labels for name, labels in after if ("endpoint", "/api/v1/operations/a-1") in labels
    ]
    latency = ("settle_host_api_request_duration_seconds_count", (("endpoint", endpoint),))
    assert after[latency] >= 2


def test_sweeps_and_checkpoints_are_reported_by_age(db: None, client: Client, token: str):
    assert ("settle_sweep_age_seconds", ()) not in samples(client)  # never swept
    pulse_record(name=Pulse.Name.SWEEP, seconds=0.25, at=timezone.now() - timedelta(seconds=30))
    found = samples(client)
    assert 30 <= found[("settle_sweep_age_seconds", ())] < 40
    assert found[("settle_sweep_last_duration_seconds", ())] == 0.25
    assert found[("settle_audit_alarms_open", ())] == 0
    assert found[("settle_lookup_lag_seconds", ())] == 0


def test_an_overdue_lookup_shows_as_lag(stuck: Stuck, client: Client, token: str):
    stuck.unknown("op-1")
    Operation.objects.filter(key="op-1").update(
        next_lookup_at=timezone.now() - timedelta(minutes=3)
    )
    assert 180 <= samples(client)[("settle_lookup_lag_seconds", ())] < 200


def test_the_sweep_task_records_its_pulse_and_duration(db: None, client: Client, token: str):
    from recovery.tasks import sweep

    timed = ("settle_sweep_duration_seconds_count", ())
    before = samples(client).get(timed, 0)
    sweep()
    after = samples(client)
    assert after[timed] >= before + 1
    assert after[("settle_sweep_age_seconds", ())] < 5
    assert Pulse.objects.get(name=Pulse.Name.SWEEP).seconds > 0


def test_made_up_http_methods_share_one_series(db: None, client: Client, token: str):
    endpoint = "/api/v1/operations/<str:key>/resume"
    other = (
        "settle_host_api_requests_total",
        (("endpoint", endpoint), ("method", "other"), ("status", "405")),
    )
    # A prefix of this run's own: the metrics directory outlives test runs.
    prefix = f"BREW{uuid.uuid4().hex[:8].upper()}"
    before = samples(client)
    for number in range(40):
        response = client.generic(f"{prefix}{number}", "/api/v1/operations/a-1/resume")
        assert response.status_code == 405
    after = samples(client)
    assert after[other] >= before.get(other, 0) + 40
    methods = {dict(labels).get("method") for name, labels in after}
    assert not [method for method in methods if method and method.startswith(prefix)]


def test_made_up_paths_share_the_unmatched_series(db: None, client: Client, token: str):
    """Not a fault today: the endpoint label is the route, so paths add no series."""
    prefix = f"made-up-{uuid.uuid4().hex[:8]}"
    for number in range(40):
        assert client.get(f"/api/{prefix}/{number}").status_code == 404
    endpoints = {dict(labels).get("endpoint") for name, labels in samples(client)}
    assert not [endpoint for endpoint in endpoints if endpoint and prefix in endpoint]
    assert "unmatched" in endpoints
