"""A credential found for a token is kept a bounded time; revocation takes effect within it.

Another process's change is played here by writing the row directly, as the console or
``manage.py`` on another machine would: this process's cache has not seen it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approver
from recovery.models import Host
from recovery.services import token_cache

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    clock = Clock()
    monkeypatch.setattr(token_cache.time, "monotonic", clock)
    yield clock


def _status(api) -> int:
    """Any authenticated host call: 404 once authenticated (no such operation), else 401."""
    return api.get("/api/v1/operations/nothing-here").status_code


def test_a_host_disabled_elsewhere_is_refused_once_the_bound_has_passed(host_api, settings, clock):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 5
    assert _status(host_api) == 404
    Host.objects.update(disabled_at=timezone.now())
    clock.now += 4.9
    assert _status(host_api) == 404  # within the bound: may still pass
    clock.now += 0.2
    assert _status(host_api) == 401


def test_an_approver_rotated_elsewhere_is_refused_once_the_bound_has_passed(
    approver_api, settings, clock
):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 1
    path = "/api/v1/approvals/00000000-0000-0000-0000-000000000000"
    assert approver_api.get(path).status_code == 404
    Approver.objects.update(token_hash="sha256:" + "1" * 64)
    clock.now += 1.01
    assert approver_api.get(path).status_code == 401


def test_with_no_bound_every_request_looks_its_token_up(host_api, settings, clock):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 0
    assert _status(host_api) == 404
    Host.objects.update(disabled_at=timezone.now())
    assert _status(host_api) == 401


def test_a_kept_credential_costs_no_statement(host_api, settings, clock):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 5
    with CaptureQueriesContext(connection) as first:
        _status(host_api)
    with CaptureQueriesContext(connection) as again:
        _status(host_api)
    assert len(again) == len(first) - 1
    assert "recovery_host" in first.captured_queries[0]["sql"]


def test_a_refused_token_is_not_kept(host_api, settings, clock):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 5
    Host.objects.update(disabled_at=timezone.now())
    assert _status(host_api) == 401
    Host.objects.update(disabled_at=None)  # enabled again elsewhere
    assert _status(host_api) == 404
