"""The host API's rate limit per credential: 429 with Retry-After past it, per credential,
counted in the shared cache, and open (never a 500, never a refusal) when the cache is gone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

from approvals.models import PermitEvent
from audit.models import AuditEvent
from recovery import ratelimit
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, 0, 250000, tzinfo=UTC)


@pytest.fixture
def limited(settings):
    settings.SETTLE_HOST_RATE_PER_SECOND = 5
    settings.SETTLE_HOST_RATE_BURST = 10  # a window of 2 s holding 10 requests


def test_a_credential_past_its_rate_gets_429_with_retry_after(limited, host_api, other_host_api):
    with time_machine.travel(START, tick=False):
        answers = [host_api.get("/api/v1/operations/none").status_code for _ in range(10)]
        assert answers == [404] * 10
        refused = host_api.get("/api/v1/operations/none")
        assert refused.status_code == 429
        assert refused["Retry-After"] == "2"
        assert refused.json()["error"] == "rate_limited"
        assert refused.json()["retry_after"] == 2
        # Another host's credential has a limit of its own.
        assert other_host_api.get("/api/v1/operations/none").status_code == 404
    with time_machine.travel(START.replace(second=2), tick=False):
        assert host_api.get("/api/v1/operations/none").status_code == 404  # a new window


def test_a_rate_limited_dispatch_is_not_recorded_as_a_refusal(limited, flow, settings):
    flow.approved()
    assert flow.dispatch().status_code == 200
    refusals = AuditEvent.objects.filter(kind="consume_refused")
    with time_machine.travel(START, tick=False):
        codes = [flow.dispatch(worker="again").status_code for _ in range(12)]
    assert codes == [409] * 10 + [429] * 2
    assert refusals.count() == 10
    assert PermitEvent.objects.filter(kind="refused").count() == 10


def test_an_unreachable_cache_lets_requests_through(
    limited, settings, host_api, caplog, monkeypatch
):
    monkeypatch.setattr(ratelimit, "_skip_until", 0.0)
    # Nothing listens on port 9 of this machine: the cache fails at once.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    body = {"key": "op-1", "action": "payment.send", "provider": "nowhere", "params": PARAMS}
    answers = [host_api.post("/api/v1/operations", body).status_code for _ in range(12)]
    assert answers == [404] * 12  # the service's own answer, every time
    assert caplog.text.count("rate limit skipped") == 1  # then skipped for a while
