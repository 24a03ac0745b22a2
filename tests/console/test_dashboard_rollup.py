"""The dashboard's rollup (console.services.dashboard): each audit event counted once,
incrementally, even by two refreshes at once. Uses the console's cast and its stuck operations."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection, connections
from django.db.models import Sum
from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.models import AuditEvent
from common.actors import Actor
from console.models import DashboardRefresh, DashboardRollup, DashboardWaiting
from console.selectors.dashboard import percentile
from console.services.dashboard import (
    HISTORY,
    SETTLE_BUCKETS,
    SETTLE_MARGIN,
    dashboard_refresh,
    settle_bucket,
)
from harness.providers import sqlite_provider_commit
from recovery.models import Evidence, State
from recovery.services.four_eyes import reconciliation_approve
from recovery.services.reconcile import operation_reconcile
from recovery.transitions import TRANSITIONS
from tests.support.flow import PARAMS, lookup_due

pytestmark = pytest.mark.django_db

LATER = timedelta(minutes=5)  # past the margin: every event so far is in the window


def _counts(figure: str) -> dict[str, int]:
    rows = DashboardRollup.objects.filter(figure=figure).values("key").annotate(n=Sum("n"))
    return {row["key"]: row["n"] for row in rows}


def test_lookups_are_counted_by_verdict_once_however_often_refreshed(stuck):
    stuck.released("op-1")
    stuck.mismatch("op-2")
    stuck.unknown("op-3")
    first = dashboard_refresh(now=timezone.now() + LATER)
    assert first.counted > 0
    expected = {}
    for verdict in Evidence.objects.filter(source="lookup").values_list("verdict", flat=True):
        expected[verdict] = expected.get(verdict, 0) + 1
    assert _counts("lookup") == expected == {"match": 1, "mismatch": 1, "absent": 1}
    # Again, and again later: nothing new, nothing counted twice.
    assert dashboard_refresh(now=timezone.now() + LATER).counted == 0
    assert dashboard_refresh(now=timezone.now() + LATER * 2).counted == 0
    assert _counts("lookup") == expected


def test_only_the_events_since_the_last_refresh_are_added(stuck):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    with time_machine.travel(an_hour_ago, tick=False):
        stuck.released("op-1")
    dashboard_refresh(now=an_hour_ago + LATER)
    through = DashboardRefresh.objects.get().through
    stuck.released("op-2")
    dashboard_refresh(now=timezone.now() + LATER)
    # The second refresh starts where the first stopped, which op-2's events all follow.
    assert not AuditEvent.objects.filter(at__gte=through, operation_key="op-1").exists()
    assert _counts("lookup") == {"match": 2}
    assert sum(_counts("settle").values()) == 2


def test_events_younger_than_the_margin_wait_for_a_later_refresh(stuck):
    """Their transactions may not all have committed: a window is added only once past it."""
    stuck.released("op-1")
    report = dashboard_refresh()
    assert report.through <= timezone.now() - SETTLE_MARGIN
    assert _counts("lookup") == {}
    dashboard_refresh(now=timezone.now() + LATER)
    assert _counts("lookup") == {"match": 1}


def test_the_first_refresh_goes_back_the_history_in_steps(stuck):
    start = timezone.now()
    report = dashboard_refresh(now=start)
    assert report.through == start - SETTLE_MARGIN
    assert report.steps == 14 * 24 == HISTORY / timedelta(hours=1)  # a transaction an hour
    refreshed = DashboardRefresh.objects.get()
    assert refreshed.through == start - SETTLE_MARGIN


def test_an_approved_void_counts_its_settle_time_and_both_operators(stuck, operator, supervisor):
    """Lease lost at 12:00, voided by four eyes at 12:07:30: 450 s, two operator actions."""
    with time_machine.travel("2026-06-01 12:00:00Z", tick=False):
        operation = stuck.mismatch("op-1")  # lease lost, then the mismatch escalated it
    with time_machine.travel("2026-06-01 12:05:00Z", tick=False):
        proposed = operation_reconcile(
            operation=operation,
            action="void",
            version=operation.version,
            reason="provider says no",
            actor=Actor.of("user", operator),
        )
        assert proposed.proposed
    with time_machine.travel("2026-06-01 12:07:30Z", tick=False):
        request = ReconciliationRequest.objects.get(operation_key="op-1")
        reconciliation_approve(
            operation=operation,
            request_id=request.pk,
            reason="checked with the provider",
            actor=Actor.of("user", supervisor),
        )
        dashboard_refresh(now=timezone.now() + LATER)
    operation.refresh_from_db()
    assert operation.state == State.VOIDED
    assert _counts("settle") == {str(settle_bucket(450)): 1}
    assert _counts("operator") == {"propose": 1, "approve": 1}
    [row] = DashboardRollup.objects.filter(figure="settle")
    assert row.hour == datetime(2026, 6, 1, 12, tzinfo=UTC)


def test_a_lookup_settling_an_unknown_operation_counts_its_time(stuck, provider_db):
    with time_machine.travel("2026-06-01 12:00:00Z", tick=False):
        operation = stuck.unknown("op-1")
    with time_machine.travel("2026-06-01 13:30:00Z", tick=False):
        sqlite_provider_commit(
            provider_db, operation_key="op-1", params=operation.params, reference="r-1"
        )
        lookup_due("op-1")
        assert stuck.flow.resume_looked_up("op-1")["state"] == "released"
        dashboard_refresh(now=timezone.now() + LATER)
    assert _counts("settle") == {str(settle_bucket(90 * 60)): 1}
    assert _counts("lookup") == {"absent": 1, "match": 1}


def test_only_a_lost_lease_leads_into_unknown():
    """The dashboard counts every ``unknown`` operation as waiting for a lost lease."""
    into_unknown = {event for (_, event), target in TRANSITIONS.items() if target == "unknown"}
    assert into_unknown == {"lease_lost"}


def test_percentiles_from_the_buckets():
    assert percentile({}, 0.5) is None
    # 100 operations settled in [10 s, 15 s): the median is halfway through the bucket.
    histogram = {settle_bucket(12): 100}
    assert percentile(histogram, 0.5) == pytest.approx(12.5)
    histogram = {settle_bucket(30): 95, settle_bucket(4000): 5}
    assert 30 <= percentile(histogram, 0.5) < 45
    assert 30 <= percentile(histogram, 0.95) <= 45
    assert 3600 <= percentile(histogram, 0.96) < 5400
    # Past the last bound it is that bound: "at least".
    assert percentile({len(SETTLE_BUCKETS): 3}, 0.5) == SETTLE_BUCKETS[-1]


@pytest.mark.django_db(transaction=True)
def test_two_refreshes_racing_count_each_event_once(stuck):
    """Two beats at once: the second waits on the state row's lock, then adds nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (CI runs it there): SQLite serialises writers anyway")
    stuck.released("op-1")
    stuck.mismatch("op-2")
    later = timezone.now() + LATER
    barrier = threading.Barrier(2)
    reports = []
    errors = []

    def run() -> None:
        try:
            barrier.wait()
            reports.append(dashboard_refresh(now=later))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(report.counted > 0 for report in reports) in ([False, True], [True, True])
    assert _counts("lookup") == {"match": 1, "mismatch": 1}
    assert sum(report.counted for report in reports) == sum(
        DashboardRollup.objects.aggregate(n=Sum("n")).values()
    )


def _waiting() -> dict[str, tuple[str, str, bool]]:
    rows = DashboardWaiting.objects.select_related("operation")
    return {row.operation.key: (row.state, row.reason, row.stranded) for row in rows}


def test_what_is_stuck_follows_the_log_and_agrees_with_a_fresh_snapshot(stuck, provider_db):
    stuck.unknown("op-1")
    stuck.mismatch("op-2")
    dashboard_refresh()  # the first: a snapshot of the operations as they are
    assert _waiting() == {
        "op-1": ("unknown", "lease_lost", True),
        "op-2": ("reconcile", "mismatch", True),
    }
    # Then the log: op-1 settles from evidence, op-3 gets stuck, op-4 settles at once.
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r-1")
    lookup_due("op-1")
    assert stuck.flow.resume_looked_up("op-1")["state"] == "released"
    stuck.unknown("op-3")
    stuck.released("op-4")
    report = dashboard_refresh()
    assert report.waiting >= 3
    incremental = _waiting()
    assert incremental == {
        "op-2": ("reconcile", "mismatch", True),
        "op-3": ("unknown", "lease_lost", True),
    }
    # Read again (the margin), nothing changes; and a snapshot taken now says the same.
    dashboard_refresh()
    assert _waiting() == incremental
    DashboardRefresh.objects.update(waiting_at=None)
    dashboard_refresh()
    assert _waiting() == incremental


def test_a_late_report_clears_the_stranded_receipt_not_the_wait(stuck):
    dashboard_refresh()
    operation = stuck.conflict("op-1", host_says="failed", provider_says="committed")
    dashboard_refresh()
    # The host's late report completed the receipt; the contradiction waits in reconcile.
    assert _waiting() == {"op-1": ("reconcile", "conflict", False)}
    assert operation.state == "reconcile"
