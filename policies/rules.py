"""The policy file: ordered rules that say what an approval needs when a host opens it.

A TOML file a team reviews in git, read whole or refused whole (``PolicyError`` names
the line and the reason)::

    [providers.payments]
    passkey = "required"            # every person's decision on it is signed

    [[rules]]
    name = "small-refunds"
    provider = "payments"           # a provider's name, or "*" (the default)
    action = "refund"               # an action's name, or "*" (the default)
    hosts = ["agent-7"]             # only these hosts' operations (default: any)
    when = ["/amount <= 5000", '/currency in ["EUR", "USD"]']
    outcome = "approve"             # approve | deny | person | quorum
    reason = "Small refunds need nobody"

    [rules.budget]                  # an approve rule may spend a budget
    per = "host"                    # "host", or "action" (the provider and action)
    window = "24h"
    count = 20                      # at most 20 approvals in any 24 hours
    sum = "/amount"                 # and the amounts they approve
    limit = 50000                   # at most 50000 in total

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
    ``MAX_DURATION``). ``permit_ttl``: how long the permit an approve rule issues lasts,
    1 s to 7 days, as a person's approval may.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import jsonpointer

ANY = "*"
OUTCOMES = ("approve", "deny", "person", "quorum")
RULE_KEYS = {
    "name",
    "provider",
    "action",
    "hosts",
    "when",
    "outcome",
    "reason",
    "budget",
    "approvals",
    "groups",
    "passkey",
    "notify",
    "escalate_to",
    "remind_after",
    "escalate_after",
    "expires_after",
    "permit_ttl",
}
BUDGET_KEYS = {"per", "window", "count", "sum", "limit"}
MAX_RULES = 1000
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
CONDITION = re.compile(r"\s*(/\S*|)\s+(==|!=|<=|>=|<|>|not in|in|matches)\s+(.+?)\s*")
DEFAULT_PERMIT_TTL = timedelta(minutes=5)
# Every duration the file names is at most this: far enough for any real rule, near
# enough that now + it is a date (a million days is not).
MAX_DURATION = timedelta(days=366)
MAX_PERMIT_TTL = timedelta(days=7)  # approvals.services.approvals.MAX_TTL_SECONDS
# What a budget can count: ``BudgetUse.amount`` holds 30 digits, 8 of them decimals.
MAX_AMOUNT = Decimal(10) ** 22


class PolicyError(ValueError):
    """The policy file is refused whole: where (``line``, 1-based; 0: the whole file) and
    why."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}" if line else reason)
        self.line, self.reason = line, reason


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def holds(found: Any, wanted: Any) -> bool:
        if _number(found) is not None and _number(wanted) is not None:
            return op(_number(found), _number(wanted))
        if isinstance(found, str) and isinstance(wanted, str):
            return op(found, wanted)
        return False

    return holds


def _equal(found: Any, wanted: Any) -> bool:
    if _number(found) is not None and _number(wanted) is not None:
        return _number(found) == _number(wanted)
    return type(found) is type(wanted) and found == wanted


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value; int and float are one type, bool is not a number."""
    if value is None or isinstance(value, bool | str | list | dict):
        return type(value).__name__
    return "number" if _number(value) is not None else type(value).__name__


def _unequal(found: Any, wanted: Any) -> bool:
    """Of the same JSON type and not equal: another type makes ``!=`` false too."""
    return _json_type(found) == _json_type(wanted) and not _equal(found, wanted)


def _not_in(found: Any, wanted: list[Any]) -> bool:
    """Of the type of some member, and equal to none."""
    kind = _json_type(found)
    return any(_json_type(item) == kind for item in wanted) and not any(
        _equal(found, item) for item in wanted
    )


def _number(value: Any) -> Decimal | None:
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
        amount = _number(self.sum.resolve(params, None))
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
class Policy:
    version: str
    rules: tuple[Rule, ...] = ()
    passkey_providers: frozenset[str] = field(default_factory=frozenset)

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


def version_of(source: bytes) -> str:
    return "sha256:" + hashlib.sha256(source).hexdigest()


def policy_parse(source: bytes) -> Policy:
    """The policy in ``source`` (a TOML file's bytes), or ``PolicyError``."""
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(0, "the file is not UTF-8") from exc
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+)", str(exc))
        raise PolicyError(int(found.group(1)) if found else 0, str(exc)) from exc
    lines = _Lines(text)
    unknown = sorted(set(document) - {"rules", "providers"})
    if unknown:
        raise PolicyError(lines.key(unknown[0]), f"unknown key {unknown[0]!r}")
    providers = document.get("providers", {})
    if not isinstance(providers, dict):
        raise PolicyError(lines.key("providers"), "providers must be a table of tables")
    passkey_providers = set()
    for name, table in providers.items():
        line = lines.header(f"providers.{name}")
        if not isinstance(table, dict) or set(table) - {"passkey"}:
            raise PolicyError(line, f"providers.{name} takes only passkey")
        if table.get("passkey", "optional") not in ("required", "optional"):
            raise PolicyError(
                lines.key_in_table(line, "passkey") or line,
                'passkey must be "required" or "optional"',
            )
        if table.get("passkey") == "required":
            passkey_providers.add(name)
    rules = document.get("rules", [])
    if not isinstance(rules, list):
        raise PolicyError(lines.key("rules"), "rules must be an array of tables: [[rules]]")
    if len(rules) > MAX_RULES:
        raise PolicyError(0, f"at most {MAX_RULES} rules")
    parsed: list[Rule] = []
    for index, table in enumerate(rules):
        parsed.append(_rule(table, lines.rule(index), lines, index))
    seen: set[str] = set()
    for rule in parsed:
        if rule.name in seen:
            raise PolicyError(rule.line, f"another rule is named {rule.name!r}")
        seen.add(rule.name)
    return Policy(
        version=version_of(source),
        rules=tuple(parsed),
        passkey_providers=frozenset(passkey_providers),
    )


def _rule(table: Any, line: int, lines: _Lines, index: int) -> Rule:
    if not isinstance(table, dict):
        raise PolicyError(line, "a rule must be a table")

    def at(key: str) -> int:
        return lines.key_in_rule(index, key) or line

    unknown = sorted(set(table) - RULE_KEYS)
    if unknown:
        raise PolicyError(at(unknown[0]), f"unknown key {unknown[0]!r} in a rule")
    name = table.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise PolicyError(at("name"), "a rule needs a name: letters, digits, '.', '_', '-'")
    outcome = table.get("outcome")
    if outcome not in OUTCOMES:
        raise PolicyError(at("outcome"), f"outcome must be one of {', '.join(OUTCOMES)}")
    when = tuple(_condition(text, at("when")) for text in _strings(table, "when", at))
    rule: dict[str, Any] = {
        "name": name,
        "line": line,
        "outcome": outcome,
        "provider": _name(table, "provider", at),
        "action": _name(table, "action", at),
        "hosts": _strings(table, "hosts", at),
        "when": when,
        "reason": _text(table, "reason", at),
    }
    if "budget" in table:
        budget_line = lines.header_in_rule(index, "budget") or line
        if outcome != "approve":
            raise PolicyError(budget_line, "only an approve rule has a budget")
        rule["budget"] = _budget(
            table["budget"], budget_line, lambda key: lines.key_in_table(budget_line, key)
        )
    people = {"approvals", "groups", "passkey", "notify", "escalate_to"} | {
        "remind_after",
        "escalate_after",
        "expires_after",
    }
    if outcome in ("approve", "deny"):
        for key in sorted(people & set(table)):
            raise PolicyError(at(key), f"{key} is for person and quorum rules")
    if outcome == "quorum":
        approvals = table.get("approvals")
        if (
            isinstance(approvals, bool)
            or not isinstance(approvals, int)
            or not 2 <= approvals <= 20
        ):
            raise PolicyError(at("approvals"), "a quorum needs approvals = 2..20")
        rule["approvals"] = approvals
    elif "approvals" in table and outcome == "person":
        raise PolicyError(at("approvals"), "approvals is for quorum rules")
    passkey = table.get("passkey", False)
    if not isinstance(passkey, bool):
        raise PolicyError(at("passkey"), "passkey must be true or false")
    rule["passkey"] = passkey
    rule["groups"] = _strings(table, "groups", at)
    rule["notify"] = _strings(table, "notify", at)
    rule["escalate_to"] = _strings(table, "escalate_to", at)
    for key in ("remind_after", "escalate_after", "expires_after"):
        if key in table:
            rule[key] = _duration(table[key], at(key), key)
    if "permit_ttl" in table:
        # The permit an approve rule issues at once; a person's approval may ask the same.
        rule["permit_ttl"] = _duration(
            table["permit_ttl"], at("permit_ttl"), "permit_ttl", MAX_PERMIT_TTL
        )
    return Rule(**rule)


def _budget(table: Any, line: int, key_line: Callable[[str], int]) -> Budget:
    """A rule's budget; ``key_line(key)``: the line of one of its keys (0: not found)."""
    if not isinstance(table, dict):
        raise PolicyError(line, "budget must be a table")

    def at(key: str) -> int:
        return key_line(key) or line

    unknown = sorted(set(table) - BUDGET_KEYS)
    if unknown:
        raise PolicyError(at(unknown[0]), f"unknown key {unknown[0]!r} in a budget")
    per = table.get("per", "host")
    if per not in ("host", "action"):
        raise PolicyError(at("per"), 'budget per must be "host" or "action"')
    if "window" not in table:
        raise PolicyError(line, "a budget needs a window")
    window = _duration(table["window"], at("window"), "window")
    count = table.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise PolicyError(at("count"), "budget count must be a whole number from 1")
    pointer, limit = table.get("sum"), table.get("limit")
    if (pointer is None) != (limit is None):
        raise PolicyError(line, "a budget's sum and limit go together")
    if count is None and pointer is None:
        raise PolicyError(line, "a budget needs a count, or a sum and a limit")
    total = None
    if limit is not None:
        total = _number(limit) if not isinstance(limit, str) else None
        if isinstance(limit, str):
            try:
                total = Decimal(limit)
            except InvalidOperation:
                total = None
        if total is None or not total.is_finite() or not 0 <= total < MAX_AMOUNT:
            raise PolicyError(at("limit"), "budget limit must be a number from 0 below 1e22")
    return Budget(
        per=per,
        window=window,
        count=count,
        sum=_pointer(pointer, line) if pointer is not None else None,
        limit=total,
    )


def _condition(text: str, line: int) -> Condition:
    found = CONDITION.fullmatch(text)
    if found is None:
        raise PolicyError(line, f"{text!r}: a condition is '<pointer> <operator> <JSON value>'")
    pointer, op, literal = found.groups()
    try:
        value = json.loads(literal, parse_constant=_no_constant)
    except ValueError as exc:
        raise PolicyError(line, f"{text!r}: {literal!r} is not a JSON value") from exc
    if not _finite(value):
        raise PolicyError(line, f"{text!r}: a number must be finite (not NaN, not Infinity)")
    if op in ("in", "not in") and not isinstance(value, list):
        raise PolicyError(line, f"{text!r}: {op} needs a JSON array")
    if op in ("<", "<=", ">", ">=") and _number(value) is None and not isinstance(value, str):
        raise PolicyError(line, f"{text!r}: {op} compares with a number or a string")
    if op == "matches":
        if not isinstance(value, str):
            raise PolicyError(line, f"{text!r}: matches needs a pattern in a JSON string")
        try:
            value = re.compile(value)
        except re.error as exc:
            raise PolicyError(line, f"{text!r}: the pattern is wrong: {exc}") from exc
    return Condition(text=text, pointer=_pointer(pointer, line), op=op, value=value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(value: Any) -> bool:
    """No infinite float anywhere in a JSON value (``1e400`` reads as one)."""
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    return True


def _pointer(text: Any, line: int) -> jsonpointer.JsonPointer:
    if not isinstance(text, str):
        raise PolicyError(line, "a JSON Pointer is a string")
    try:
        pointer = jsonpointer.JsonPointer(text)
    except jsonpointer.JsonPointerException as exc:
        raise PolicyError(line, f"{text!r} is not a JSON Pointer: {exc}") from exc
    if not text:
        raise PolicyError(line, "the pointer must name a parameter, such as /amount")
    return pointer


def _duration(value: Any, line: int, key: str, maximum: timedelta = MAX_DURATION) -> timedelta:
    found = DURATION.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise PolicyError(line, f'{key} is a duration such as "90s", "15m", "4h" or "7d"')
    duration = timedelta(**{UNITS[found.group(2)]: int(found.group(1))})
    if duration > maximum:
        raise PolicyError(line, f"{key} is at most {maximum.days} days")
    return duration


def _name(table: dict[str, Any], key: str, at: Callable[[str], int]) -> str:
    value = table.get(key, ANY)
    if not isinstance(value, str) or not (value == ANY or 0 < len(value) <= 200):
        raise PolicyError(at(key), f'{key} must be a name or "*"')
    return value


def _text(table: dict[str, Any], key: str, at: Callable[[str], int]) -> str:
    value = table.get(key, "")
    if not isinstance(value, str) or len(value) > 500:
        raise PolicyError(at(key), f"{key} must be a string of at most 500 characters")
    return value


def _strings(table: dict[str, Any], key: str, at: Callable[[str], int]) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise PolicyError(at(key), f"{key} must be a list of strings")
    return tuple(value)


class _Lines:
    """Where things are in the file's text, for errors: tomllib reports no positions
    for values it read, so the rules' headers and keys are found by scanning."""

    HEADER = re.compile(r"\s*\[\[\s*rules\s*\]\]")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.rule_starts = [n for n, line in enumerate(self.lines) if self.HEADER.match(line)]

    def rule(self, index: int) -> int:
        return self.rule_starts[index] + 1 if index < len(self.rule_starts) else 0

    def _rule_span(self, index: int) -> range:
        if index >= len(self.rule_starts):
            return range(0)
        end = self.rule_starts[index + 1] if index + 1 < len(self.rule_starts) else len(self.lines)
        return range(self.rule_starts[index], end)

    def key_in_rule(self, index: int, key: str) -> int:
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        for n in self._rule_span(index):
            if pattern.match(self.lines[n]):
                return n + 1
        return 0

    def header_in_rule(self, index: int, name: str) -> int:
        pattern = re.compile(rf"\s*\[\s*rules\.{re.escape(name)}\s*\]")
        for n in self._rule_span(index):
            if pattern.match(self.lines[n]):
                return n + 1
        return self.key_in_rule(index, name)

    def key_in_table(self, header: int, key: str) -> int:
        """The line of ``key`` in the table whose header is on line ``header`` (1-based),
        up to the next header; 0 when it is not written there."""
        if not header:
            return 0
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        for n in range(header, len(self.lines)):
            if self.lines[n].lstrip().startswith("["):
                break
            if pattern.match(self.lines[n]):
                return n + 1
        return 0

    def key(self, key: str) -> int:
        pattern = re.compile(rf"\s*(\[+\s*)?{re.escape(key)}\b")
        for n, line in enumerate(self.lines):
            if pattern.match(line):
                return n + 1
        return 0

    def header(self, dotted: str) -> int:
        pattern = re.compile(rf"\s*\[\s*{re.escape(dotted)}\s*\]")
        for n, line in enumerate(self.lines):
            if pattern.match(line):
                return n + 1
        return 0
