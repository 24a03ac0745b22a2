"""The supervisor dashboard's waiting rows and summary, kept by its refresh
(``console.services.dashboard``, under the lock of its state row).

waiting
    What is stuck: a ``DashboardWaiting`` row per operation in ``unknown`` or
    ``reconcile`` or with a stranded receipt. The first refresh takes it from the
    operations themselves (a snapshot); each later one applies the transitions and
    receipt events since the previous one, read again from the refresh's margin before
    it. Applying an operation's events sets its row (never adds to a count) and follows
    its chain's order, so reading an event twice changes nothing, and the rows lag the
    log by the refresh's interval only.
summary
    What the dashboard shows of each provider that is not read per hour (what is stuck,
    by state, reason and age, the oldest; settle-time histograms), made from the waiting
    rows and the rollup once per refresh, so that a page view reads one row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.db.models import Count, Exists, Min, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from audit.kinds import AuditKind
from audit.models import AuditEvent
from console.models import DashboardRefresh, DashboardRollup, DashboardWaiting
from recovery.models import RECEIPT_MAY_RUN_STATES, UNSETTLED_STATES, Dispatch, Operation, State
from recovery.selectors.queue import QUEUE_AGES
from recovery.transitions import Event
from recovery.vocabulary import WaitReason

# -- what is stuck ----------------------------------------------------------------------

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


def dashboard_waiting_refresh(state: DashboardRefresh, *, margin: timedelta) -> int:
    """Bring the waiting rows up to now; how many operations' rows were set.

    Runs with the state row locked, like the windows; the events since the last time
    are read again from ``margin`` before it (the rollup's ``SETTLE_MARGIN``).
    """
    now = timezone.now()
    if state.waiting_at is None:
        count = _waiting_snapshot(now)
    else:
        count = _waiting_apply(state.waiting_at - margin, now)
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
    stuck = Operation.objects.filter(state__in=list(UNSETTLED_STATES)).annotate(
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
        .exclude(operation__state__in=RECEIPT_MAY_RUN_STATES)
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
    if target in UNSETTLED_STATES:
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


def dashboard_summary(now: datetime) -> dict[str, Any]:
    """Per provider id: what is stuck (``stuck``: unknown, reconcile, stranded; ``reasons``;
    ``ages``; ``oldest``: [since, operation id]) and ``settle`` histograms per window.

    A few grouped reads of the waiting rows and of the rollup, once per refresh.
    """
    in_queue = Q(state__in=list(UNSETTLED_STATES))
    ages = {
        f"age_{name}": Count("pk", filter=in_queue & _age_q(newer, older, now))
        for name, (newer, older) in AGES.items()
    }
    summary: dict[str, dict[str, Any]] = {}

    def provider(pk: int) -> dict[str, Any]:
        return summary.setdefault(
            str(pk),
            {
                "stuck": dict.fromkeys([*UNSETTLED_STATES, WaitReason.STRANDED], 0),
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
            DashboardWaiting.objects.filter(provider=pk, since=at, state__in=list(UNSETTLED_STATES))
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
