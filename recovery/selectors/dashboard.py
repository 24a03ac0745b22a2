"""The supervisor dashboard: what is stuck now, and how the last day and weeks went.

For supervisors only: a user sees the providers on which they hold the supervisor's own
permission (``approve_reconciliations``), and nothing of the others, even those they
operate or view. What is stuck now is read live, from the indexes on the unsettled
states and on running receipts; the rest from the rollup (``recovery.services.dashboard``),
whose refresh time the page shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from django.db.models import Count, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from recovery.models import (
    AuditEvent,
    DashboardRefresh,
    DashboardRollup,
    Dispatch,
    Operation,
    Provider,
    State,
    Verdict,
)
from recovery.permissions import ProviderPermission
from recovery.selectors.access import providers_for_user
from recovery.selectors.queue import _REASON_OF_TRANSITION, QUEUE_AGES, QUEUE_STRANDED
from recovery.services.dashboard import SETTLE_BUCKETS
from recovery.vocabulary import AuditKind, WaitReason

LOOKUP_HOURS = 24
OPERATOR_DAYS = 14
SETTLE_WINDOWS = {"day": timedelta(days=1), "week": timedelta(days=7)}
# The settle-time chart's bars: (label, upper bound in seconds, or None for the rest).
SETTLE_BARS: tuple[tuple[str, int | None], ...] = (
    ("under 1 min", 60),
    ("1 to 5 min", 300),
    ("5 to 15 min", 900),
    ("15 to 60 min", 3600),
    ("1 to 4 h", 14400),
    ("4 to 24 h", 86400),
    ("over 1 day", None),
)
OPERATOR_ACTIONS = ("confirm", "void", "repair", "lookup", "propose", "approve", "reject")


def dashboard_providers_for_user(*, user: Any) -> list[Provider]:
    """The providers ``user`` supervises, by name: all the dashboard will show them."""
    supervising = (ProviderPermission.APPROVE_RECONCILIATIONS,)
    return list(providers_for_user(user=user, permissions=supervising).order_by("name"))


@dataclass(frozen=True)
class StuckRow:
    provider: str
    unknown: int = 0
    reconcile: int = 0
    stranded: int = 0


@dataclass(frozen=True)
class Percentiles:
    """Settle times over one window: how many, and the median and p95 in seconds."""

    count: int
    median: float | None
    p95: float | None


@dataclass
class Dashboard:
    providers: list[Provider]
    stuck: list[StuckRow]
    reasons: dict[str, int]
    ages: dict[str, int]
    oldest: Operation | None
    lookup_hours: list[datetime]
    lookups: dict[datetime, dict[str, int]]
    settle: dict[str, Percentiles]
    settle_bars: list[tuple[str, int]]
    operator_days: list[date]
    operator: dict[date, dict[str, int]]
    refresh: DashboardRefresh | None
    now: datetime = field(default_factory=timezone.now)

    @property
    def stuck_total(self) -> StuckRow:
        return StuckRow(
            "All",
            sum(row.unknown for row in self.stuck),
            sum(row.reconcile for row in self.stuck),
            sum(row.stranded for row in self.stuck),
        )


def dashboard_for_user(*, user: Any, providers: list[Provider]) -> Dashboard:
    """The dashboard of ``providers``, each of which ``user`` supervises.

    ``providers`` comes from ``dashboard_providers_for_user`` (all of them or the one
    the page is filtered to); anything else is dropped here, so that no caller can show
    a provider the user does not supervise.
    """
    allowed = {p.pk for p in dashboard_providers_for_user(user=user)}
    chosen = [p for p in providers if p.pk in allowed]
    ids = [p.pk for p in chosen]
    now = timezone.now()
    stuck, ages, oldest_at = _stuck(chosen, now)
    lookup_hours, lookups = _lookups(ids, now)
    settle, bars = _settle(ids, now)
    operator_days, operator = _operator(ids, now)
    return Dashboard(
        providers=chosen,
        stuck=stuck,
        reasons=_reasons(ids, stuck),
        ages=ages,
        oldest=_oldest(ids, oldest_at),
        lookup_hours=lookup_hours,
        lookups=lookups,
        settle=settle,
        settle_bars=bars,
        operator_days=operator_days,
        operator=operator,
        refresh=DashboardRefresh.objects.filter(name="rollup").first(),
        now=now,
    )


def _stuck(
    providers: list[Provider], now: datetime
) -> tuple[list[StuckRow], dict[str, int], datetime | None]:
    """Per provider: unknown, reconcile, stranded now; the queue's ages; the oldest time.

    One grouped read of the unsettled rows (``operation_provider_state``), one of the
    running receipts of operations no longer dispatched (``receipt_running``).
    """
    ids = [p.pk for p in providers]
    age_counts = {
        name: Count("pk", filter=_age_q(newer, older, now))
        for name, (_, newer, older) in QUEUE_AGES.items()
    }
    grouped = (
        Operation.objects.filter(state__in=[State.UNKNOWN, State.RECONCILE], provider__in=ids)
        .values("provider", "state")
        .annotate(n=Count("pk"), oldest=Min("updated_at"), **age_counts)
        .order_by()
    )
    by_provider: dict[int, dict[str, int]] = {pk: {} for pk in ids}
    ages = dict.fromkeys(QUEUE_AGES, 0)
    oldest: datetime | None = None
    for line in _rows(grouped):
        by_provider[line["provider"]][line["state"]] = line["n"]
        for name in QUEUE_AGES:
            ages[name] += line[name]
        if oldest is None or line["oldest"] < oldest:
            oldest = line["oldest"]
    stranded = (
        Dispatch.objects.filter(
            receipt_status=Dispatch.ReceiptStatus.RUNNING, operation__provider__in=ids
        )
        .exclude(operation__state=State.DISPATCHED)
        .values("operation__provider")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for line in _rows(stranded):
        by_provider[line["operation__provider"]][QUEUE_STRANDED] = line["n"]
    rows = [
        StuckRow(
            p.name,
            by_provider[p.pk].get(State.UNKNOWN, 0),
            by_provider[p.pk].get(State.RECONCILE, 0),
            by_provider[p.pk].get(QUEUE_STRANDED, 0),
        )
        for p in providers
    ]
    return rows, ages, oldest


def _rows(values: Iterable[Any]) -> Iterable[dict[str, Any]]:
    """A ``values()`` query's rows, for rows whose keys are computed (the stubs type them
    by literal key only)."""
    return cast(Iterable[dict[str, Any]], values)


def _age_q(newer: timedelta | None, older: timedelta | None, now: datetime) -> Q:
    q = Q()
    if newer is not None:
        q &= Q(updated_at__lte=now - newer)
    if older is not None:
        q &= Q(updated_at__gt=now - older)
    return q


def _reasons(ids: list[int], stuck: list[StuckRow]) -> dict[str, int]:
    """Why what is stuck waits, in the queue's words.

    ``unknown`` is entered only by a lost lease (the transition table has no other way
    in) and a stranded receipt waits for itself: both are counted already. Only
    ``reconcile`` has reasons of several kinds, read from each one's last transition.
    """
    reasons = dict.fromkeys(WaitReason.values, 0)
    reasons[WaitReason.LEASE_LOST] = sum(row.unknown for row in stuck)
    reasons[WaitReason.STRANDED] = sum(row.stranded for row in stuck)
    if not any(row.reconcile for row in stuck):
        return reasons
    last = (
        AuditEvent.objects.filter(operation_key=OuterRef("key"), kind=AuditKind.TRANSITION)
        .order_by("-seq")
        .annotate(code=_REASON_OF_TRANSITION)
        .values("code")[:1]
    )
    grouped = (
        Operation.objects.filter(state=State.RECONCILE, provider__in=ids)
        .annotate(reason=Subquery(last))
        .values("reason")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for line in grouped:
        reasons[line["reason"] or "other"] = reasons.get(line["reason"] or "other", 0) + line["n"]
    return reasons


def _oldest(ids: list[int], at: datetime | None) -> Operation | None:
    """The operation that has waited longest in ``unknown`` or ``reconcile``."""
    if at is None:
        return None
    return (
        Operation.objects.filter(
            state__in=[State.UNKNOWN, State.RECONCILE], provider__in=ids, updated_at=at
        )
        .select_related("provider")
        .order_by("pk")
        .first()
    )


def _hour_floor(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _lookups(
    ids: list[int], now: datetime
) -> tuple[list[datetime], dict[datetime, dict[str, int]]]:
    """Lookups per hour by verdict, the last ``LOOKUP_HOURS`` hours (this one included)."""
    last = _hour_floor(now)
    hours = [last - timedelta(hours=back) for back in range(LOOKUP_HOURS - 1, -1, -1)]
    table = {hour: dict.fromkeys(Verdict.values, 0) for hour in hours}
    rows = (
        DashboardRollup.objects.filter(
            figure=DashboardRollup.Figure.LOOKUP, hour__gte=hours[0], provider__in=ids
        )
        .values("hour", "key")
        .annotate(n=Sum("n"))
        .order_by()
    )
    for row in rows:
        hour = row["hour"].astimezone(UTC)
        if hour in table:
            table[hour][row["key"]] = table[hour].get(row["key"], 0) + row["n"]
    return hours, table


def _settle(ids: list[int], now: datetime) -> tuple[dict[str, Percentiles], list[tuple[str, int]]]:
    """Lost lease to settled: median and p95 per window; the week's counts in bars."""
    since = {name: now - length for name, length in SETTLE_WINDOWS.items()}
    rows = (
        DashboardRollup.objects.filter(
            figure=DashboardRollup.Figure.SETTLE,
            hour__gte=_hour_floor(min(since.values())),
            provider__in=ids,
        )
        .values("key")
        .annotate(
            **{
                name: Sum("n", filter=Q(hour__gte=_hour_floor(start)))
                for name, start in since.items()
            }
        )
        .order_by()
    )
    histograms: dict[str, dict[int, int]] = {name: {} for name in SETTLE_WINDOWS}
    for row in _rows(rows):
        for name in SETTLE_WINDOWS:
            if row[name]:
                histograms[name][int(row["key"])] = row[name]
    settle = {
        name: Percentiles(
            sum(histogram.values()),
            percentile(histogram, 0.5),
            percentile(histogram, 0.95),
        )
        for name, histogram in histograms.items()
    }
    bars = []
    week = histograms["week"]
    low = 0
    for label, upper in SETTLE_BARS:
        top = len(SETTLE_BUCKETS) + 1 if upper is None else SETTLE_BUCKETS.index(upper) + 1
        bars.append((label, sum(n for bucket, n in week.items() if low <= bucket < top)))
        low = top
    return settle, bars


def percentile(histogram: dict[int, int], fraction: float) -> float | None:
    """The ``fraction`` quantile of a settle-time histogram, in seconds (None if empty).

    Interpolated within its bucket; past the last bound it is that bound.
    """
    total = sum(histogram.values())
    if not total:
        return None
    rank = fraction * total
    seen = 0
    for bucket in sorted(histogram):
        n = histogram[bucket]
        if seen + n >= rank:
            if bucket >= len(SETTLE_BUCKETS):
                return float(SETTLE_BUCKETS[-1])
            low = SETTLE_BUCKETS[bucket - 1] if bucket else 0
            high = SETTLE_BUCKETS[bucket]
            return low + (high - low) * (rank - seen) / n
        seen += n
    return float(SETTLE_BUCKETS[-1])


def _operator(ids: list[int], now: datetime) -> tuple[list[date], dict[date, dict[str, int]]]:
    """Operator actions per day (UTC), by action, the last ``OPERATOR_DAYS`` days."""
    today = now.astimezone(UTC).date()
    days = [today - timedelta(days=back) for back in range(OPERATOR_DAYS - 1, -1, -1)]
    start = datetime.combine(days[0], datetime.min.time(), tzinfo=UTC)
    table = {day: dict.fromkeys(OPERATOR_ACTIONS, 0) for day in days}
    rows = (
        DashboardRollup.objects.filter(
            figure=DashboardRollup.Figure.OPERATOR, hour__gte=start, provider__in=ids
        )
        .annotate(day=TruncDate("hour", tzinfo=UTC))
        .values("day", "key")
        .annotate(n=Sum("n"))
        .order_by()
    )
    for row in rows:
        if row["day"] in table:
            table[row["day"]][row["key"]] = table[row["day"]].get(row["key"], 0) + row["n"]
    return days, table
