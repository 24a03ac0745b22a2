"""Which parameters differ between the intended action and the provider's own record.

A ``mismatch`` verdict says only that two digests differ; an operator deciding what to
do needs to see *which* parameters. The provider's parameters are in the evidence's
raw record where its adapter keeps them: the SQLite receipt's ``params_json`` (always),
a journal line's or an HTTP record's ``params`` (when the provider writes them).

Paths are dotted: ``amount``, ``to.iban``, ``items.0.sku`` (a list element by index).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.canonical import CanonicalError, canonical_dumps, strict_loads


class _Missing:
    """The side of a difference that holds nothing at that path."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class ParamDifference:
    path: str
    intended: Any  # MISSING when only the provider has this path
    provider: Any  # MISSING when only the intended action has it

    @property
    def intended_text(self) -> str:
        return _text(self.intended)

    @property
    def provider_text(self) -> str:
        return _text(self.provider)


@dataclass(frozen=True)
class ParamRow:
    """One leaf of a parameter tree, as the operation page lists it."""

    path: str
    value: str  # canonical JSON of the leaf
    differs: bool


def _text(value: Any) -> str:
    if value is MISSING:
        return "(not present)"
    try:
        return canonical_dumps(value).decode("utf-8")
    except (ValueError, TypeError):  # e.g. an integer beyond 2^53 in a corrupt record
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def provider_params(raw: Any) -> Any | None:
    """The parameters the provider's record holds, or None when it holds none we can read.

    An unparsable ``params_json`` is None too: that record is ``corrupt`` already, and
    its text is on the page as captured.
    """
    if not isinstance(raw, dict):
        return None
    receipt = raw.get("receipt")
    if isinstance(receipt, dict) and isinstance(receipt.get("params_json"), str):
        try:
            return strict_loads(receipt["params_json"])
        except CanonicalError:
            return None
    record = raw.get("record")
    if isinstance(record, dict) and "params" in record:
        return record["params"]
    return None


def provider_digest(raw: Any) -> str | None:
    """The params digest the provider's record claims (SQLite receipt, journal, HTTP)."""
    if not isinstance(raw, dict):
        return None
    for holder in ("receipt", "record"):
        part = raw.get(holder)
        if isinstance(part, dict) and isinstance(part.get("params_digest"), str):
            return str(part["params_digest"])
    return None


def _same(a: Any, b: Any) -> bool:
    # ``True == 1`` in Python, but not in JSON; 1 and 1.0 are one number in both.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _join(path: str, part: object) -> str:
    return f"{path}.{part}" if path else str(part)


def params_diff(intended: Any, provider: Any) -> list[ParamDifference]:
    """Every path at which ``intended`` and ``provider`` differ, in path order.

    Objects are compared key by key and lists element by element, so one changed
    amount is one difference, not the whole tree; a path present on one side only is
    a difference with ``MISSING`` on the other.
    """
    found: list[ParamDifference] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(_join(path, key), a.get(key, MISSING), b.get(key, MISSING))
        elif isinstance(a, list) and isinstance(b, list):
            for index in range(max(len(a), len(b))):
                walk(
                    _join(path, index),
                    a[index] if index < len(a) else MISSING,
                    b[index] if index < len(b) else MISSING,
                )
        elif a is MISSING or b is MISSING or not _same(a, b):
            found.append(ParamDifference(path, a, b))

    walk("", intended, provider)
    return found


def params_rows(params: Any, differing: list[ParamDifference]) -> list[ParamRow]:
    """The leaves of ``params`` with their dotted paths, each marked if it differs.

    A leaf differs when a difference names it or an object or list above it (the
    provider holding a number where the intended action holds an object).
    """
    paths = [d.path for d in differing]
    rows: list[ParamRow] = []

    def differs(path: str) -> bool:
        return any(p == path or path.startswith(p + ".") or p == "" for p in paths)

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key in sorted(value):
                walk(_join(path, key), value[key])
        elif isinstance(value, list) and value:
            for index, item in enumerate(value):
                walk(_join(path, index), item)
        else:
            rows.append(ParamRow(path or "(value)", _text(value), differs(path)))

    walk("", params)
    return rows
