"""The supervisor dashboard: what is stuck now, and how lookups, settling and operators went.

For supervisors: a user who supervises no provider gets 403 (they may use the console,
not this page), and a supervisor sees only the providers they supervise, however many
others they operate or view.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from console.charts import Bar, Series, bar_chart, legend
from console.selectors.dashboard import (
    OPERATOR_ACTIONS,
    Dashboard,
    dashboard_for_user,
    dashboard_providers_for_user,
)
from console.services.dashboard import SETTLE_MARGIN
from console.views.access import request_roles
from policies.selectors import budgets_in_use
from recovery.models import Verdict
from recovery.selectors.queue import QUEUE_AGES, QUEUE_REASONS
from recovery.vocabulary import WaitReason

VERDICT_SERIES = (
    Series(Verdict.MATCH, "match", "solid", "var(--ok)"),
    Series(Verdict.MISMATCH, "mismatch", "hatch", "var(--bad)"),
    Series(Verdict.CORRUPT, "corrupt", "cross", "var(--bad)"),
    Series(Verdict.ABSENT, "absent", "dots", "var(--warn)"),
    Series(Verdict.UNAVAILABLE, "unavailable", "lines", "var(--muted)"),
)
ACTION_SERIES = (
    Series("confirm", "confirm", "solid", "var(--ok)"),
    Series("void", "void", "hatch", "var(--bad)"),
    Series("repair", "repair", "dots", "var(--info)"),
    Series("lookup", "look up", "lines", "var(--accent)"),
    Series("propose", "propose", "cross", "var(--warn)"),
    Series("approve", "approve", "checks", "var(--ok)"),
    Series("reject", "reject", "columns", "var(--bad)"),
)
assert [one.key for one in ACTION_SERIES] == list(OPERATOR_ACTIONS)
COUNT = (Series("n", "operations", "solid", "var(--accent)"),)
# The order the queue's reasons are shown in (the queue's own words).
REASONS = (
    WaitReason.LEASE_LOST,
    WaitReason.MISMATCH,
    WaitReason.CORRUPT,
    WaitReason.CONFLICT,
    WaitReason.LOOKUP_BUDGET_SPENT,
    WaitReason.STRANDED,
)


@login_required
@require_safe
def dashboard(request: HttpRequest) -> HttpResponse:
    """The dashboard of every provider the user supervises, or of the one asked for.

    A provider the user does not supervise (or that does not exist) is ignored, and
    said so, without telling which of the two it was.
    """
    if not request_roles(request).supervises:
        raise PermissionDenied("The dashboard is for supervisors of a provider.")
    supervised = dashboard_providers_for_user(user=request.user)
    wanted = request.GET.get("provider", "")
    chosen = [p for p in supervised if p.name == wanted] if wanted else supervised
    ignored = bool(wanted) and not chosen
    board = dashboard_for_user(user=request.user, providers=chosen or supervised)
    context = {
        "board": board,
        "supervised": supervised,
        "selected": chosen[0].name if wanted and chosen else "",
        "ignored": wanted if ignored else "",
        "margin_minutes": int(SETTLE_MARGIN.total_seconds() // 60),
        "budgets": budgets_in_use(providers={provider.name for provider in chosen or supervised}),
        **_figures(board, chosen[0].name if wanted and chosen else ""),
    }
    template = "console/dashboard.html#figures" if request.htmx else "console/dashboard.html"  # type: ignore[attr-defined]
    return render(request, template, context)


def _queue_link(provider: str, **filters: str) -> str:
    query = {"provider": provider, **filters} if provider else filters
    return reverse("home") + "?" + urlencode(query)


def _figures(board: Dashboard, provider: str) -> dict[str, Any]:
    """Each chart's SVG, and the rows of the table beside it."""
    reasons = [(QUEUE_REASONS[reason], board.reasons.get(reason, 0), reason) for reason in REASONS]
    ages = [(label, board.ages[name], name) for name, (label, _, _) in QUEUE_AGES.items()]
    lookups = [(f"{hour:%H}:00", board.lookups[hour], hour) for hour in board.lookup_hours]
    operator = [(f"{day:%a %d %b}", board.operator[day], day) for day in board.operator_days]
    return {
        "reasons": reasons,
        "reasons_chart": bar_chart(
            chart_id="chart-reasons",
            title="Stuck now, by reason",
            description="How many operations and receipts wait for an operator, by why.",
            bars=[
                Bar(label, {"n": n}, _queue_link(provider, reason=code))
                for label, n, code in reasons
            ],
            series=COUNT,
        ),
        "ages": ages,
        "ages_chart": bar_chart(
            chart_id="chart-ages",
            title="Queue by time waiting",
            description="Operations in unknown or reconcile, by how long they have waited.",
            bars=[Bar(label, {"n": n}, _queue_link(provider, age=code)) for label, n, code in ages],
            series=COUNT,
            label_width=34,
        ),
        "lookups": [
            (label, [counts.get(one.key, 0) for one in VERDICT_SERIES], sum(counts.values()))
            for label, counts, _ in lookups
        ],
        "verdicts": VERDICT_SERIES,
        "lookups_chart": bar_chart(
            chart_id="chart-lookups",
            title="Lookups per hour by verdict, last 24 hours (UTC)",
            description="Each bar one hour, its parts the verdicts of that hour's lookups.",
            bars=[Bar(label, counts) for label, counts, _ in lookups],
            series=VERDICT_SERIES,
            label_width=14,
        ),
        "lookups_legend": legend(chart_id="chart-lookups", series=VERDICT_SERIES),
        "settle_rows": [
            (
                label,
                board.settle[name],
                _span(board.settle[name].median),
                _span(board.settle[name].p95),
            )
            for name, label in (("day", "Last 24 hours"), ("week", "Last 7 days"))
        ],
        "settle_bars": board.settle_bars,
        "settle_chart": bar_chart(
            chart_id="chart-settle",
            title="Lost lease to settled, last 7 days",
            description="Operations settled after their worker's lease was lost, by time taken.",
            bars=[Bar(label, {"n": n}) for label, n in board.settle_bars],
            series=COUNT,
            label_width=34,
        ),
        "operator": [
            (label, [counts.get(one.key, 0) for one in ACTION_SERIES], sum(counts.values()))
            for label, counts, _ in operator
        ],
        "actions": ACTION_SERIES,
        "operator_chart": bar_chart(
            chart_id="chart-operator",
            title="Operator actions per day, last 14 days (UTC)",
            description="Each bar one day, its parts the decisions and proposals operators made.",
            bars=[Bar(label, counts) for label, counts, _ in operator],
            series=ACTION_SERIES,
            label_width=24,
        ),
        "operator_legend": legend(chart_id="chart-operator", series=ACTION_SERIES),
    }


def _span(seconds: float | None) -> str:
    """``1 min 35 s``: a length of time in its two largest units."""
    if seconds is None:
        return "—"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    parts: list[str] = []
    for name, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if whole >= size or parts:
            parts.append(f"{whole // size} {name}")
            whole %= size
        if len(parts) == 2:
            break
    return " ".join(parts)
