"""One name, one thing: a name defined in two layers for different work makes every reader
open all of them (STYLE.md). The names issue 36 found used twice stay apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [
    "approvals",
    "audit",
    "bulk",
    "common",
    "console",
    "customers",
    "dbsql",
    "identity",
    "monitoring",
    "policies",
    "recovery",
    "settle",
    "webhooks",
]


def _definitions() -> list[tuple[str, bool, str]]:
    """Every top-level function and class in shipped code: its name, whether a class, where."""
    found = []
    for app in SHIPPED:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    where = str(path.relative_to(ROOT))
                    found.append((node.name, isinstance(node, ast.ClassDef), where))
    return found


DEFINITIONS = _definitions()


@pytest.mark.parametrize(
    "name",
    [
        "permit_revoke",
        "approval_decide",
        "approval_decision",
        "permit_history",
        "operation_permit_history",
        "supervises_any_provider",
    ],
)
def test_a_name_found_twice_is_defined_once(name: str) -> None:
    where = [path for defined, _, path in DEFINITIONS if defined == name]
    assert len(where) <= 1, where


def test_classes_are_named_as_classes() -> None:
    # ``audit_transaction`` is used as Django's ``transaction.atomic`` is, and named so.
    lowercase = [
        (name, path)
        for name, is_class, path in DEFINITIONS
        if is_class and name[:1].islower() and name != "audit_transaction"
    ]
    assert lowercase == []
