"""The supervisor dashboard's rollup: audit events counted per provider and hour, once each.

figure
    What a ``DashboardRollup`` row counts: ``lookup`` (a lookup's evidence, by verdict),
    ``operator`` (an operator's decision or proposal, by action), ``settle`` (an
    operation settled after its worker's lease was lost, by how long that took: the
    index of its bucket in ``SETTLE_BUCKETS``).
window
    The audit events whose ``at`` lies in [``through``, new ``through``): a refresh adds
    each window once and moves ``through`` in the same transaction, under the lock of the
    ``DashboardRefresh`` row, so two refreshes at once never count an event twice (the
    second waits, then finds the window done).
horizon
    A refresh stops ``SETTLE_MARGIN`` short of now. An event's ``at`` is read when it is
    appended, before its transaction commits; an event not yet visible could still
    commit with an ``at`` inside a window already added. Within that margin every
    transaction has ended (the assumption the audit checkpoints' rescan makes too), so
    the figures trail the log by it and miss nothing.
waiting
    What is stuck, and the summary a page view reads of it: made by the same refresh
    (``console.services.dashboard_waiting``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Subquery,
)
from django.db.models.fields.json import KT
from django.db.models.functions import TruncHour
from django.utils import timezone

from audit.checkpoints import CHECKPOINT_RESCAN
from audit.kinds import AuditKind
from audit.models import AuditEvent
from console.models import DashboardRefresh, DashboardRollup
from console.services.dashboard_waiting import dashboard_summary, dashboard_waiting_refresh
from recovery.models import Operation, State
from recovery.transitions import Event

SETTLE_MARGIN = CHECKPOINT_RESCAN
# The first refresh starts this far back; rows older than KEEP are deleted.
HISTORY = timedelta(days=14)
KEEP = timedelta(days=30)
# At most this much of the log is added in one transaction (the first refresh adds
# HISTORY of it, in steps).
STEP = timedelta(hours=1)

# Upper bounds, in seconds, of the settle-time buckets (the last one is open): close
# enough together that a percentile read from them is within about a third of its value.
SETTLE_BUCKETS: tuple[int, ...] = (
    *(1, 2, 3, 5, 7, 10, 15, 20, 30, 45),
    *(60, 90, 120, 180, 300, 420, 600, 900, 1200, 1800, 2700),
    *(3600, 5400, 7200, 10800, 14400, 21600, 28800, 43200, 64800),
    *(86400, 129600, 172800, 259200, 345600, 604800, 1209600),
)

SETTLED_FROM = (State.UNKNOWN, State.RECONCILE)
SETTLED_TO = (State.RELEASED, State.VOIDED, State.FAILED)

# The operator kinds counted, and the action each stands for (``operator_action`` names
# its own in its data).
OPERATOR_KINDS: dict[str, str] = {
    AuditKind.OPERATOR_ACTION: "",
    AuditKind.RECONCILIATION_PROPOSED: "propose",
    AuditKind.RECONCILIATION_APPROVED: "approve",
    AuditKind.RECONCILIATION_REJECTED: "reject",
}

_ROLLUP_NAME = "rollup"


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh added: the windows, the events counted, where it now stands;
    and how many operations' waiting rows it set."""

    steps: int
    counted: int
    through: datetime
    waiting: int = 0


def settle_bucket(seconds: float) -> int:
    """The index of the bucket a settle time falls in (below its upper bound)."""
    return bisect.bisect_right(SETTLE_BUCKETS, seconds)


def dashboard_refresh(*, now: datetime | None = None) -> RefreshReport:
    """Add the audit events since the last refresh to the rollup, up to the horizon.

    Each step of at most ``STEP`` is its own transaction, so a refresh stopped halfway
    keeps what it added and the next one goes on from there.
    """
    horizon = (now or timezone.now()) - SETTLE_MARGIN
    steps = counted = 0
    while True:
        added = _refresh_step(horizon)
        if added is None:
            break
        steps += 1
        counted += added
    with transaction.atomic():
        state = _refresh_locked(horizon)
        waiting = dashboard_waiting_refresh(state, margin=SETTLE_MARGIN)
        state.summary = dashboard_summary(state.waiting_at or horizon)
        state.save(update_fields=["summary"])
        _prune(horizon)
    return RefreshReport(steps, counted, state.through, waiting)


def _refresh_locked(horizon: datetime) -> DashboardRefresh:
    """The rollup's one state row, locked (made on first use, ``HISTORY`` back)."""
    DashboardRefresh.objects.bulk_create(
        [DashboardRefresh(name=_ROLLUP_NAME, through=horizon - HISTORY, refreshed_at=horizon)],
        ignore_conflicts=True,
    )
    return DashboardRefresh.objects.select_for_update().get(name=_ROLLUP_NAME)


@transaction.atomic
def _refresh_step(horizon: datetime) -> int | None:
    """Add one window; how many events it counted, or None when there was none to add.

    The state row is locked first and ``through`` read under that lock: a refresh that
    waited for another reads where that one stopped.
    """
    state = _refresh_locked(horizon)
    start = state.through
    if start >= horizon:
        return None
    end = min(horizon, start + STEP)
    counts: Counter[tuple[str, datetime, int, str]] = Counter()
    _lookups_count(counts, start, end)
    _operator_count(counts, start, end)
    _settled_count(counts, start, end)
    _rollup_add(counts)
    state.through = end
    state.refreshed_at = timezone.now()
    state.save(update_fields=["through", "refreshed_at"])
    return sum(counts.values())


def _window(start: datetime, end: datetime) -> dict[str, object]:
    return {"at__gte": start, "at__lt": end}


def _provider_of_event() -> Subquery:
    return Subquery(Operation.objects.filter(key=OuterRef("operation_key")).values("provider")[:1])


def _hour() -> TruncHour:
    return TruncHour("at", tzinfo=UTC)


def _lookups_count(
    counts: Counter[tuple[str, datetime, int, str]], start: datetime, end: datetime
) -> None:
    """Evidence a lookup captured, by verdict (a provider's callbacks are not lookups)."""
    rows = (
        AuditEvent.objects.filter(
            kind=AuditKind.EVIDENCE, data__source="lookup", **_window(start, end)
        )
        .annotate(provider_id=_provider_of_event(), hour=_hour(), verdict=KT("data__verdict"))
        .values("provider_id", "hour", "verdict")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        if row["provider_id"] is not None:
            key = (DashboardRollup.Figure.LOOKUP, row["hour"], row["provider_id"], row["verdict"])
            counts[key] += row["n"]


def _operator_count(
    counts: Counter[tuple[str, datetime, int, str]], start: datetime, end: datetime
) -> None:
    rows = (
        AuditEvent.objects.filter(kind__in=list(OPERATOR_KINDS), **_window(start, end))
        .annotate(provider_id=_provider_of_event(), hour=_hour(), action=KT("data__action"))
        .values("provider_id", "hour", "kind", "action")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        if row["provider_id"] is None:
            continue
        action = (OPERATOR_KINDS[row["kind"]] or row["action"] or "other")[:40]
        key = (DashboardRollup.Figure.OPERATOR, row["hour"], row["provider_id"], action)
        counts[key] += row["n"]


def _settled_count(
    counts: Counter[tuple[str, datetime, int, str]], start: datetime, end: datetime
) -> None:
    """Settling transitions of operations that lost their lease, by the time it took.

    The lease is lost once per operation at most (``dispatched`` is left once): its
    event is found along the operation's own chain.
    """
    lost = (
        AuditEvent.objects.filter(
            operation_key=OuterRef("operation_key"),
            kind=AuditKind.TRANSITION,
            data__event=Event.LEASE_LOST,
        )
        .order_by()
        .values("at")[:1]
    )
    rows = (
        AuditEvent.objects.filter(
            kind=AuditKind.TRANSITION,
            data__from__in=[str(s) for s in SETTLED_FROM],
            data__to__in=[str(s) for s in SETTLED_TO],
            **_window(start, end),
        )
        .annotate(provider_id=_provider_of_event(), hour=_hour(), lost_at=Subquery(lost))
        .filter(lost_at__isnull=False)
        .annotate(took=ExpressionWrapper(F("at") - F("lost_at"), output_field=DurationField()))
        .values_list("provider_id", "hour", "took")
    )
    for provider_id, hour, took in rows:
        if provider_id is not None:
            bucket = str(settle_bucket(took.total_seconds()))
            counts[(DashboardRollup.Figure.SETTLE, hour, provider_id, bucket)] += 1


def _rollup_add(counts: Counter[tuple[str, datetime, int, str]]) -> None:
    """Add each count to its row: INSERT … ON CONFLICT DO UPDATE, on both databases."""
    table = DashboardRollup._meta.db_table
    items: Iterable[tuple[tuple[str, datetime, int, str], int]] = sorted(
        counts.items(), key=lambda item: (item[0][0], item[0][1], item[0][2], item[0][3])
    )
    adapt = connection.ops.adapt_datetimefield_value  # as the ORM writes a DateTimeField
    rows = [
        (str(figure), adapt(hour), provider, key, n) for (figure, hour, provider, key), n in items
    ]
    sql = (
        f'INSERT INTO "{table}" ("figure", "hour", "provider_id", "key", "n")'
        " VALUES (%s, %s, %s, %s, %s)"
        ' ON CONFLICT ("figure", "hour", "provider_id", "key")'
        f' DO UPDATE SET "n" = "{table}"."n" + EXCLUDED."n"'
    )
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(sql, rows)


def _prune(horizon: datetime) -> None:
    DashboardRollup.objects.filter(hour__lt=horizon - KEEP).delete()
