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
    What is stuck: a ``DashboardWaiting`` row per operation in ``unknown`` or
    ``reconcile`` or with a stranded receipt. The first refresh takes it from the
    operations themselves (a snapshot); each later one applies the transitions and
    receipt events since the previous one, read again from ``SETTLE_MARGIN`` before it.
    Applying an operation's events sets its row (never adds to a count) and follows its
    chain's order, so reading an event twice changes nothing, and the rows lag the log
    by the refresh's interval only.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    Subquery,
    Sum,
)
from django.db.models.fields.json import KT
from django.db.models.functions import TruncHour
from django.utils import timezone

from console.models import DashboardRefresh, DashboardRollup, DashboardWaiting
from recovery.audit.checkpoints import CHECKPOINT_RESCAN
from recovery.models import AuditEvent, Dispatch, Operation, State
from recovery.selectors.queue import QUEUE_AGES
from recovery.transitions import Event
from recovery.vocabulary import AuditKind, WaitReason

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
        waiting = _waiting_refresh(state)
        state.summary = _summary(state.waiting_at or horizon)
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


# -- what is stuck ----------------------------------------------------------------------

STUCK_STATES = (State.UNKNOWN, State.RECONCILE)
_WAITING_KINDS = (AuditKind.TRANSITION, AuditKind.HOST_REPORT, AuditKind.RECEIPT_RECOVERED)
_BATCH = 1000


def wait_reason(data: dict[str, Any]) -> str:
    """Why an operation waits, from the transition that brought it there (the queue's
    words: ``recovery.selectors.queue``)."""
    if data.get("reason") == WaitReason.LOOKUP_BUDGET_SPENT:
        return WaitReason.LOOKUP_BUDGET_SPENT
    event = str(data.get("event", ""))
    if event == Event.ESCALATE and data.get("verdict") in (WaitReason.MISMATCH, WaitReason.CORRUPT):
        return str(data["verdict"])
    if event == Event.CONFLICT:
        return WaitReason.CONFLICT
    if event == Event.LEASE_LOST:
        return WaitReason.LEASE_LOST
    return event[:40]


def _waiting_refresh(state: DashboardRefresh) -> int:
    """Bring the waiting rows up to now; how many operations' rows were set.

    Runs with the state row locked, like the windows.
    """
    now = timezone.now()
    if state.waiting_at is None:
        count = _waiting_snapshot(now)
    else:
        count = _waiting_apply(state.waiting_at - SETTLE_MARGIN, now)
    state.waiting_at = now
    state.save(update_fields=["waiting_at"])
    return count


def _waiting_snapshot(now: datetime) -> int:
    """The first rows, from the operations and receipts as they are: once, at any size."""
    DashboardWaiting.objects.all().delete()
    last = (
        AuditEvent.objects.filter(operation_key=OuterRef("key"), kind=AuditKind.TRANSITION)
        .order_by("-seq")
        .values("data")[:1]
    )
    stranded = Dispatch.objects.filter(
        operation=OuterRef("pk"), receipt_status=Dispatch.ReceiptStatus.RUNNING
    )
    rows = []
    stuck = Operation.objects.filter(state__in=list(STUCK_STATES)).annotate(
        last=Subquery(last), stranded=Exists(stranded)
    )
    for pk, provider, state, updated_at, data, is_stranded in stuck.values_list(
        "pk", "provider", "state", "updated_at", "last", "stranded"
    ).iterator(chunk_size=_BATCH):
        reason = WaitReason.LEASE_LOST if state == State.UNKNOWN else wait_reason(data or {})
        rows.append(
            DashboardWaiting(
                operation_id=pk,
                provider_id=provider,
                state=state,
                reason=reason,
                stranded=is_stranded,
                since=updated_at,
            )
        )
    settled = (
        Dispatch.objects.filter(receipt_status=Dispatch.ReceiptStatus.RUNNING)
        .exclude(operation__state__in=[State.DISPATCHED, *STUCK_STATES])
        .values_list("operation", "operation__provider", "lease_expires_at")
    )
    for pk, provider, lapsed in settled.iterator(chunk_size=_BATCH):
        rows.append(
            DashboardWaiting(operation_id=pk, provider_id=provider, stranded=True, since=lapsed)
        )
    DashboardWaiting.objects.bulk_create(rows, batch_size=_BATCH)
    return len(rows)


def _waiting_apply(start: datetime, end: datetime) -> int:
    """Set the rows of the operations with a transition or receipt event in [start, end)."""
    events = (
        AuditEvent.objects.filter(kind__in=list(_WAITING_KINDS), at__gte=start, at__lt=end)
        .exclude(operation_key="")
        .order_by("operation_key", "seq")
        .values_list("operation_key", "kind", "at", "data")
    )
    by_key: dict[str, list[tuple[str, datetime, dict[str, Any]]]] = {}
    for key, kind, at, data in events:
        by_key.setdefault(key, []).append((kind, at, data))
    keys = list(by_key)
    count = 0
    for begin in range(0, len(keys), _BATCH):
        batch = keys[begin : begin + _BATCH]
        operations = dict(
            (key, (pk, provider))
            for key, pk, provider in Operation.objects.filter(key__in=batch).values_list(
                "key", "pk", "provider"
            )
        )
        held = DashboardWaiting.objects.in_bulk([pk for pk, _ in operations.values()])
        kept: list[DashboardWaiting] = []
        gone: list[DashboardWaiting] = []
        for key in batch:
            if key not in operations:
                continue
            pk, provider = operations[key]
            row = held.get(pk) or DashboardWaiting(operation_id=pk, provider_id=provider)
            for kind, at, data in by_key[key]:
                _waiting_event(row, kind, at, data)
            (kept if row.state or row.stranded else gone).append(row)
        DashboardWaiting.objects.bulk_create(
            kept,
            update_conflicts=True,
            unique_fields=["operation"],
            update_fields=["state", "reason", "stranded", "since"],
        )
        DashboardWaiting.objects.filter(pk__in=[row.pk for row in gone]).delete()
        count += len(kept) + len(gone)
    return count


def _waiting_event(row: DashboardWaiting, kind: str, at: datetime, data: dict[str, Any]) -> None:
    """One event's effect on an operation's waiting row (set, never added)."""
    if kind in (AuditKind.HOST_REPORT, AuditKind.RECEIPT_RECOVERED):
        row.stranded = False  # the receipt is complete: the first report wins
        return
    target = data.get("to", "")
    if data.get("event") == Event.LEASE_LOST:
        # A lease lapses only while the receipt runs: from now on it is stranded.
        row.stranded = True
    if target in STUCK_STATES:
        row.state = target
        row.reason = WaitReason.LEASE_LOST if target == State.UNKNOWN else wait_reason(data)
        row.since = at
    else:
        row.state = ""
        row.reason = ""
        if row.since is None:
            row.since = at


# -- the summary ------------------------------------------------------------------------

# How long an operation has waited in its state, in the queue's bands.
AGES = {name: (newer, older) for name, (_, newer, older) in QUEUE_AGES.items()}
SETTLE_WINDOWS = {"day": timedelta(days=1), "week": timedelta(days=7)}


def _age_q(newer: timedelta | None, older: timedelta | None, now: datetime) -> Q:
    q = Q()
    if newer is not None:
        q &= Q(since__lte=now - newer)
    if older is not None:
        q &= Q(since__gt=now - older)
    return q


def _summary(now: datetime) -> dict[str, Any]:
    """Per provider id: what is stuck (``stuck``: unknown, reconcile, stranded; ``reasons``;
    ``ages``; ``oldest``: [since, operation id]) and ``settle`` histograms per window.

    A few grouped reads of the waiting rows and of the rollup, once per refresh.
    """
    in_queue = Q(state__in=list(STUCK_STATES))
    ages = {
        f"age_{name}": Count("pk", filter=in_queue & _age_q(newer, older, now))
        for name, (newer, older) in AGES.items()
    }
    summary: dict[str, dict[str, Any]] = {}

    def provider(pk: int) -> dict[str, Any]:
        return summary.setdefault(
            str(pk),
            {
                "stuck": dict.fromkeys([*STUCK_STATES, WaitReason.STRANDED], 0),
                "reasons": {},
                "ages": dict.fromkeys(AGES, 0),
                "oldest": None,
                "settle": {name: {} for name in SETTLE_WINDOWS},
            },
        )

    grouped = (
        DashboardWaiting.objects.values("provider", "state", "reason", "stranded")
        .annotate(n=Count("pk"), oldest=Min("since", filter=in_queue), **ages)
        .order_by()
    )
    oldest: dict[int, datetime] = {}
    for line in cast(Iterable[dict[str, Any]], grouped):
        one = provider(line["provider"])
        if line["state"]:
            one["stuck"][line["state"]] += line["n"]
            one["reasons"][line["reason"]] = one["reasons"].get(line["reason"], 0) + line["n"]
        if line["stranded"]:
            one["stuck"][WaitReason.STRANDED] += line["n"]
            one["reasons"][WaitReason.STRANDED] = (
                one["reasons"].get(WaitReason.STRANDED, 0) + line["n"]
            )
        for name in AGES:
            one["ages"][name] += line[f"age_{name}"]
        at = line["oldest"]
        if at is not None and (line["provider"] not in oldest or at < oldest[line["provider"]]):
            oldest[line["provider"]] = at
    for pk, at in oldest.items():
        first = (
            DashboardWaiting.objects.filter(provider=pk, since=at, state__in=list(STUCK_STATES))
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        provider(pk)["oldest"] = [at.isoformat(), first]
    since = {name: _hour_floor(now - length) for name, length in SETTLE_WINDOWS.items()}
    settled = (
        DashboardRollup.objects.filter(
            figure=DashboardRollup.Figure.SETTLE, hour__gte=min(since.values())
        )
        .values("provider", "key")
        .annotate(**{name: Sum("n", filter=Q(hour__gte=start)) for name, start in since.items()})
        .order_by()
    )
    for row in cast(Iterable[dict[str, Any]], settled):
        for name in SETTLE_WINDOWS:
            if row[name]:
                provider(row["provider"])["settle"][name][row["key"]] = row[name]
    return summary


def _hour_floor(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
