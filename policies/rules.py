"""What a policy is once read: ordered rules, and which of them match an opening.

The file they come from, and how it is read or refused, is ``policies.policy_file``'s.

rule
    Matches an opening when its provider, action and hosts do and every condition in
    ``when`` holds. The first matching rule decides; an ``approve`` rule whose budget
    the opening does not fit is passed over. No rule matched: one person, as without
    a policy.
condition
    ``<JSON Pointer> <operator> <JSON value>`` on the parameters: ``==``,
    ``!=``, ``<``, ``<=``, ``>``, ``>=`` (numbers with numbers, strings with strings),
    ``in`` and ``not in`` (a JSON array), ``matches`` (a regular expression the whole
    string must match). A pointer that names nothing, or a value of another JSON type
    (string, number, boolean, null, array, object; ``in`` and ``not in``: of no member's
    type), makes the condition false, ``!=`` and ``not in`` included: a rule never
    matches by accident, nor because a host changed a value's type. The value is a
    finite JSON value: ``NaN`` and numbers too large for a float are refused.
budget
    Spends, per approval it pays for, the ``sum`` parameter's value: a number from 0 to
    ``MAX_AMOUNT``. Any other value (negative: it would give budget back; missing, not a
    number, too large) is not counted, and the rule does not pay for the opening.
outcome
    ``approve``: Settle approves it, recording the rule and the policy's version.
    ``deny``: Settle denies it. ``person``: one person decides. ``quorum``:
    ``approvals`` distinct people (at least 2). ``person`` and ``quorum`` may name
    ``groups`` the people come from, ``passkey = true``, and who is told: ``notify``
    and ``escalate_to`` (groups), ``remind_after``, ``escalate_after``,
    ``expires_after`` (durations such as "90s", "15m", "4h", "7d", each at most
    ``policy_file.MAX_DURATION``). ``permit_ttl``: how long the permit an approve rule
    issues lasts, 1 s to 7 days, as a person's approval may.
    ``customer``: the party the host named when opening it decides, by its approval link
    (``customer_passkey = true``: signed with their passkey). ``customer_and_staff``:
    the party and one staff person, as a ``person`` rule names them, must both approve;
    either declines. Both expire after ``expires_after`` (default
    ``DEFAULT_CUSTOMER_EXPIRY``): a link that never expires is not handed out.
action summary
    An ``[[actions]]`` entry: for a provider (or "*") and an action (or "*"), the
    sentence that says in plain words what the action does, with placeholders for its
    parameters (``policies.summaries`` renders it). Tried in the file's order, like rules:
    the first that matches is the action's summary.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import jsonpointer

ANY = "*"
CUSTOMER_OUTCOMES = ("customer", "customer_and_staff")
DEFAULT_CUSTOMER_EXPIRY = timedelta(days=1)
DEFAULT_PERMIT_TTL = timedelta(minutes=5)
# What a budget can count: ``BudgetUse.amount`` holds 30 digits, 8 of them decimals.
MAX_AMOUNT = Decimal(10) ** 22


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def holds(found: Any, wanted: Any) -> bool:
        if json_number(found) is not None and json_number(wanted) is not None:
            return op(json_number(found), json_number(wanted))
        if isinstance(found, str) and isinstance(wanted, str):
            return op(found, wanted)
        return False

    return holds


def _equal(found: Any, wanted: Any) -> bool:
    if json_number(found) is not None and json_number(wanted) is not None:
        return json_number(found) == json_number(wanted)
    return type(found) is type(wanted) and found == wanted


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value; int and float are one type, bool is not a number."""
    if value is None or isinstance(value, bool | str | list | dict):
        return type(value).__name__
    return "number" if json_number(value) is not None else type(value).__name__


def _unequal(found: Any, wanted: Any) -> bool:
    """Of the same JSON type and not equal: another type makes ``!=`` false too."""
    return _json_type(found) == _json_type(wanted) and not _equal(found, wanted)


def _not_in(found: Any, wanted: list[Any]) -> bool:
    """Of the type of some member, and equal to none."""
    kind = _json_type(found)
    return any(_json_type(item) == kind for item in wanted) and not any(
        _equal(found, item) for item in wanted
    )


def json_number(value: Any) -> Decimal | None:
    """A JSON number as an exact decimal (``0.1`` is one tenth); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return Decimal(str(value))


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": _equal,
    "!=": _unequal,
    "<": _compare(operator.lt),
    "<=": _compare(operator.le),
    ">": _compare(operator.gt),
    ">=": _compare(operator.ge),
    "in": lambda found, wanted: any(_equal(found, item) for item in wanted),
    "not in": _not_in,
    "matches": lambda found, wanted: isinstance(found, str) and bool(wanted.fullmatch(found)),
}

_MISSING = object()


@dataclass(frozen=True)
class Condition:
    text: str
    pointer: jsonpointer.JsonPointer
    op: str
    value: Any

    def holds(self, params: Any) -> bool:
        found = self.pointer.resolve(params, _MISSING)
        return found is not _MISSING and OPERATORS[self.op](found, self.value)


@dataclass(frozen=True)
class Budget:
    per: str  # "host" or "action"
    window: timedelta
    count: int | None
    sum: jsonpointer.JsonPointer | None
    limit: Decimal | None

    def amount(self, params: Any) -> Decimal | None:
        """What this opening spends of the sum, or None when it cannot be counted (the
        parameter is missing, not a number, negative or over ``MAX_AMOUNT``): the budget
        does not pay for it."""
        if self.sum is None:
            return Decimal(0)
        amount = json_number(self.sum.resolve(params, None))
        if amount is None or not amount.is_finite() or not 0 <= amount < MAX_AMOUNT:
            return None
        return amount


@dataclass(frozen=True)
class Rule:
    name: str
    line: int
    outcome: str
    provider: str = ANY
    action: str = ANY
    hosts: tuple[str, ...] = ()
    when: tuple[Condition, ...] = ()
    reason: str = ""
    budget: Budget | None = None
    approvals: int = 1
    groups: tuple[str, ...] = ()
    passkey: bool = False
    customer_passkey: bool = False
    notify: tuple[str, ...] = ()
    escalate_to: tuple[str, ...] = ()
    remind_after: timedelta | None = None
    escalate_after: timedelta | None = None
    expires_after: timedelta | None = None
    permit_ttl: timedelta = DEFAULT_PERMIT_TTL

    def matches(self, *, provider: str, action: str, host: str, params: Any) -> bool:
        return (
            self.provider in (ANY, provider)
            and self.action in (ANY, action)
            and (not self.hosts or host in self.hosts)
            and all(condition.holds(params) for condition in self.when)
        )


@dataclass(frozen=True)
class Placeholder:
    """``{/amount:money:/currency}``: the parameter at ``pointer`` in ``format`` ("",
    "money", "date" or "datetime"); money reads its currency code at ``currency``."""

    text: str
    pointer: jsonpointer.JsonPointer
    format: str = ""
    currency: jsonpointer.JsonPointer | None = None


@dataclass(frozen=True)
class ActionSummary:
    """An ``[[actions]]`` entry: the summary's literal text and placeholders, in order."""

    line: int
    action: str
    provider: str = ANY
    parts: tuple[str | Placeholder, ...] = ()

    def matches(self, *, provider: str, action: str) -> bool:
        return self.provider in (ANY, provider) and self.action in (ANY, action)


@dataclass(frozen=True)
class Policy:
    version: str
    rules: tuple[Rule, ...] = ()
    passkey_providers: frozenset[str] = field(default_factory=frozenset)
    actions: tuple[ActionSummary, ...] = ()

    def summary_for(self, *, provider: str, action: str) -> ActionSummary | None:
        """The first ``[[actions]]`` entry for this provider's action, if any."""
        return next(
            (entry for entry in self.actions if entry.matches(provider=provider, action=action)),
            None,
        )

    def matching(self, *, provider: str, action: str, host: str, params: Any) -> list[Rule]:
        """The rules that match this opening, in the file's order."""
        return [
            rule
            for rule in self.rules
            if rule.matches(provider=provider, action=action, host=host, params=params)
        ]


NO_POLICY = Policy(version="")
# What an approval needs when no rule decided: one person, as without a policy.
ONE_PERSON = Rule(name="", line=0, outcome="person")
