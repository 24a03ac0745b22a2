"""approvals.services is a package by concern: each module small, and an ``__init__`` that
re-exports nothing, so that a caller imports a name from the module that defines it."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "approvals" / "services"


def test_each_concern_is_a_module_under_500_lines() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in SERVICES.glob("*.py")}
    assert {"errors.py", "approvers.py", "approvals.py", "permits.py"} <= set(sizes)
    assert {name: lines for name, lines in sizes.items() if lines > 500} == {}


def test_the_package_re_exports_nothing() -> None:
    body = ast.parse((SERVICES / "__init__.py").read_text()).body
    assert all(isinstance(node, ast.Expr | ast.ImportFrom) for node in body)
    assert not [
        node for node in body if isinstance(node, ast.ImportFrom) and node.module != "__future__"
    ]
