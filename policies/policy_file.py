"""The policy file: the TOML a team reviews in git, read whole or refused whole.

``policy_parse`` turns its bytes into a ``policies.rules.Policy`` (which says what the
rules mean), or raises ``PolicyError`` naming the line and the reason. A file::

    [providers.payments]
    passkey = "required"            # every person's decision on it is signed

    [[rules]]
    name = "small-refunds"
    provider = "payments"           # a provider's name, or "*" (the default)
    action = "refund"               # an action's name, or "*" (the default)
    hosts = ["agent-7"]             # only these hosts' operations (default: any)
    when = ["/amount <= 5000", '/currency in ["EUR", "USD"]']
    outcome = "approve"             # approve | deny | person | quorum | customer
                                    # | customer_and_staff
    reason = "Small refunds need nobody"

    [rules.budget]                  # an approve rule may spend a budget
    per = "host"                    # "host", or "action" (the provider and action)
    window = "24h"
    count = 20                      # at most 20 approvals in any 24 hours
    sum = "/amount"                 # and the amounts they approve
    limit = 50000                   # at most 50000 in total

    [[actions]]                     # the action in plain words (policies.summaries)
    provider = "payments"           # a provider's name, or "*" (the default)
    action = "refund"               # an action's name, or "*"
    summary = "Refund {/amount:money:/currency} to {/to} on {/on:date}"

A summary's placeholder is ``{<JSON Pointer>}`` or ``{<JSON Pointer>:<format>}``, the
format one of ``money:<JSON Pointer to the currency code>``, ``date`` or ``datetime``;
``{{`` and ``}}`` are literal braces. The pointer ends at the first ``:`` or ``}``, so
a parameter whose name holds either cannot be named in a summary.

tomllib reports no positions for the values it read, so the lines errors name are found
by scanning the text (``policies.file_lines``).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import jsonpointer

from common.canonical import sha256_digest
from policies.file_lines import Lines
from policies.rules import (
    ANY,
    CUSTOMER_OUTCOMES,
    DEFAULT_CUSTOMER_EXPIRY,
    MAX_AMOUNT,
    ActionSummary,
    Budget,
    Condition,
    Placeholder,
    Policy,
    Rule,
    json_number,
)

OUTCOMES = ("approve", "deny", "person", "quorum", "customer", "customer_and_staff")
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
    "customer_passkey",
    "notify",
    "escalate_to",
    "remind_after",
    "escalate_after",
    "expires_after",
    "permit_ttl",
}
BUDGET_KEYS = {"per", "window", "count", "sum", "limit"}
ACTION_KEYS = {"provider", "action", "summary"}
FORMATS = ("money", "date", "datetime")
MAX_RULES = 1000
MAX_ACTIONS = 1000
MAX_SUMMARY = 300  # characters of the summary as written, placeholders included
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
CONDITION = re.compile(r"\s*(/\S*|)\s+(==|!=|<=|>=|<|>|not in|in|matches)\s+(.+?)\s*")
# Every duration the file names is at most this: far enough for any real rule, near
# enough that now + it is a date (a million days is not).
MAX_DURATION = timedelta(days=366)
MAX_PERMIT_TTL = timedelta(days=7)  # approvals.services.approvals.MAX_TTL_SECONDS


class PolicyError(ValueError):
    """The policy file is refused whole: where (``line``, 1-based; 0: the whole file) and
    why."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}" if line else reason)
        self.line, self.reason = line, reason


def version_of(source: bytes) -> str:
    """The policy file's version: the digest of its bytes, as they were applied."""
    return sha256_digest(source)


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
    lines = Lines(text)
    unknown = sorted(set(document) - {"rules", "providers", "actions"})
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
    actions = document.get("actions", [])
    if not isinstance(actions, list):
        raise PolicyError(lines.key("actions"), "actions must be an array of tables: [[actions]]")
    if len(actions) > MAX_ACTIONS:
        raise PolicyError(0, f"at most {MAX_ACTIONS} actions")
    return Policy(
        version=version_of(source),
        rules=tuple(parsed),
        passkey_providers=frozenset(passkey_providers),
        actions=tuple(
            _action(table, lines.action(index), lines, index) for index, table in enumerate(actions)
        ),
    )


def _action(table: Any, line: int, lines: Lines, index: int) -> ActionSummary:
    if not isinstance(table, dict):
        raise PolicyError(line, "an action must be a table")

    def at(key: str) -> int:
        return lines.key_in_action(index, key) or line

    unknown = sorted(set(table) - ACTION_KEYS)
    if unknown:
        raise PolicyError(at(unknown[0]), f"unknown key {unknown[0]!r} in an action")
    if "action" not in table:
        raise PolicyError(line, 'an action needs action: its name, or "*"')
    if "summary" not in table:
        raise PolicyError(line, "an action needs a summary")
    summary = table["summary"]
    if not isinstance(summary, str) or not summary.strip():
        raise PolicyError(at("summary"), "summary must be a sentence")
    if len(summary) > MAX_SUMMARY:
        raise PolicyError(at("summary"), f"summary is at most {MAX_SUMMARY} characters")
    return ActionSummary(
        line=line,
        provider=_name(table, "provider", at),
        action=_name(table, "action", at),
        parts=_summary_parts(summary, at("summary")),
    )


def _summary_parts(text: str, line: int) -> tuple[str | Placeholder, ...]:
    """A summary's literal text and placeholders; ``{{`` and ``}}`` are braces."""
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if text.startswith(("{{", "}}"), i):
            literal.append(char)
            i += 2
        elif char == "}":
            raise PolicyError(line, f"summary: a lone '}}' at {i + 1}; write '}}}}' for a brace")
        elif char == "{":
            end = text.find("}", i + 1)
            if end < 0 or "{" in text[i + 1 : end]:
                raise PolicyError(
                    line, f"summary: the placeholder at {i + 1} is not closed; '{{{{' is a brace"
                )
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(_placeholder(text[i : end + 1], line))
            i = end + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _placeholder(text: str, line: int) -> Placeholder:
    """``{/amount}``, ``{/on:date}``, ``{/at:datetime}``, ``{/amount:money:/currency}``."""
    pointer, colon, kind = text[1:-1].partition(":")
    if not pointer.startswith("/"):
        raise PolicyError(line, f"summary: {text} must name a parameter, such as {{/amount}}")
    if not colon:
        return Placeholder(text=text, pointer=_pointer(pointer, line))
    name, _, currency = kind.partition(":")
    if name not in FORMATS or (name == "money") != bool(currency):
        raise PolicyError(
            line,
            f"summary: {text}: unknown format {kind!r}; one of money:<pointer to the "
            "currency code>, date, datetime",
        )
    return Placeholder(
        text=text,
        pointer=_pointer(pointer, line),
        format=name,
        currency=_pointer(currency, line) if currency else None,
    )


def _rule(table: Any, line: int, lines: Lines, index: int) -> Rule:
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
        for key in sorted((people | {"customer_passkey"}) & set(table)):
            raise PolicyError(at(key), f"{key} is for person and quorum rules")
    if outcome == "customer":
        staff = {"approvals", "groups", "passkey", "escalate_to", "escalate_after"}
        for key in sorted(staff & set(table)):
            raise PolicyError(at(key), f"{key} is for staff: use customer_and_staff")
    if outcome in ("person", "quorum") and "customer_passkey" in table:
        raise PolicyError(at("customer_passkey"), "customer_passkey is for customer rules")
    if outcome == "customer_and_staff" and "approvals" in table:
        raise PolicyError(at("approvals"), "the staff side of customer_and_staff is one person")
    customer_passkey = table.get("customer_passkey", False)
    if not isinstance(customer_passkey, bool):
        raise PolicyError(at("customer_passkey"), "customer_passkey must be true or false")
    rule["customer_passkey"] = customer_passkey
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
    if outcome in CUSTOMER_OUTCOMES:
        rule.setdefault("expires_after", DEFAULT_CUSTOMER_EXPIRY)
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
        total = json_number(limit) if not isinstance(limit, str) else None
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
    if op in ("<", "<=", ">", ">=") and json_number(value) is None and not isinstance(value, str):
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
