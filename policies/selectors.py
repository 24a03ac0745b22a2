"""Reads of the policy in force: its rules as the console shows them, and its budgets' use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import reduce
from operator import or_

from django.db.models import Count, Q, Sum
from django.utils import timezone

from policies.models import BudgetUse, Policy
from policies.rules import ANY, Rule
from policies.rules import Policy as ParsedPolicy
from policies.services import policy_current


@dataclass(frozen=True)
class BudgetUseRow:
    """How much of one budget one scope (a host, or a provider's action) used in its window."""

    rule: Rule
    scope: str
    count: int
    total: Decimal

    @property
    def window(self) -> timedelta:
        assert self.rule.budget is not None
        return self.rule.budget.window


def policy_in_force() -> Policy | None:
    return Policy.objects.order_by("-id").first()


def budgets_in_use(
    *, providers: set[str] | None = None, policy: ParsedPolicy | None = None
) -> list[BudgetUseRow]:
    """Each budget's use in its window, per scope, for the rules of ``providers`` (None:
    every rule) of ``policy`` (None: the one in force, one statement more). One grouped
    count."""
    rules = [
        rule
        for rule in (policy_current() if policy is None else policy).rules
        if rule.budget is not None
        and (providers is None or rule.provider in providers or rule.provider == ANY)
    ]
    if not rules:
        return []
    now = timezone.now()
    within = reduce(
        or_,
        (Q(budget=rule.name, at__gt=now - rule.budget.window) for rule in rules if rule.budget),
    )
    used = (
        BudgetUse.objects.filter(within)
        .values_list("budget", "scope")
        .annotate(n=Count("id"), total=Sum("amount"))
        .order_by("budget", "scope")
    )
    by_name = {rule.name: rule for rule in rules}
    return [
        BudgetUseRow(rule=by_name[name], scope=scope, count=n, total=total or Decimal(0))
        for name, scope, n, total in used
    ]
