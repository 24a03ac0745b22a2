"""The supervisor dashboard: what is stuck now, and how the last day and weeks went.

For supervisors only: a user sees the providers on which they hold the supervisor's own
permission (``approve_reconciliations``), and nothing of the others, even those they
operate or view. Every figure comes from what the refresh keeps
(``console.services.dashboard``): what is stuck from its waiting rows (as of its last
run, every minute), the rest from the hourly rollup; the page says when each was made.
A few small reads, however many operations there are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from console.models import DashboardRefresh, DashboardRollup
from console.services.dashboard import SETTLE_BUCKETS
from console.services.dashboard_waiting import SETTLE_WINDOWS
from recovery.models import UNSETTLED_STATES, Operation, Provider, Verdict
from recovery.selectors.access import providers_supervised
from recovery.selectors.queue import QUEUE_AGES, QUEUE_STRANDED
from recovery.vocabulary import WaitReason

LOOKUP_HOURS = 24
OPERATOR_DAYS = 14
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
    return list(providers_supervised(user=user).order_by("name"))


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
    refresh = DashboardRefresh.objects.filter(name="rollup").first()
    summary = refresh.summary if refresh is not None else {}
    parts = [summary.get(str(p.pk), {}) for p in chosen]
    stuck = [
        StuckRow(p.name, *(part.get("stuck", {}).get(c, 0) for c in _COLUMNS))
        for p, part in zip(chosen, parts, strict=True)
    ]
    lookup_hours, lookups = _lookups(ids, now)
    settle, bars = _settle(parts)
    operator_days, operator = _operator(ids, now)
    return Dashboard(
        providers=chosen,
        stuck=stuck,
        reasons=_summed(parts, "reasons", WaitReason.values),
        ages=_summed(parts, "ages", QUEUE_AGES),
        oldest=_oldest(parts),
        lookup_hours=lookup_hours,
        lookups=lookups,
        settle=settle,
        settle_bars=bars,
        operator_days=operator_days,
        operator=operator,
        refresh=refresh,
        now=now,
    )


_COLUMNS = (*UNSETTLED_STATES, QUEUE_STRANDED)


def _summed(parts: list[dict[str, Any]], name: str, keys: Iterable[str]) -> dict[str, int]:
    total = dict.fromkeys(keys, 0)
    for part in parts:
        for key, n in part.get(name, {}).items():
            total[key] = total.get(key, 0) + n
    return total


def _oldest(parts: list[dict[str, Any]]) -> Operation | None:
    """The operation that has waited longest in ``unknown`` or ``reconcile``."""
    found = [part["oldest"] for part in parts if part.get("oldest")]
    if not found:
        return None
    _, pk = min(found)
    return Operation.objects.filter(pk=pk).select_related("provider").first()


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


def _settle(parts: list[dict[str, Any]]) -> tuple[dict[str, Percentiles], list[tuple[str, int]]]:
    """Lost lease to settled: median and p95 per window; the week's counts in bars."""
    histograms: dict[str, dict[int, int]] = {name: {} for name in SETTLE_WINDOWS}
    for part in parts:
        for name, histogram in part.get("settle", {}).items():
            for bucket, n in histogram.items():
                histograms[name][int(bucket)] = histograms[name].get(int(bucket), 0) + n
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
