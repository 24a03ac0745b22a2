"""Imports point one way: console → recovery → approvals → dbsql.

``dbsql``, the hand-written SQL, is infrastructure under every app and imports none.
``console``, the operator's UI (views, bulk work, the dashboard, reading and exporting
the audit trail), is the top of the product: above it is only ``bench``, a development
tool a production install does not have.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BELOW = {
    "dbsql": ("approvals", "recovery", "console"),
    "approvals": ("recovery", "console"),
    "recovery": ("console",),
    "console": ("bench",),
}


def _imports(path: Path) -> set[str]:
    """The top-level packages a module imports, wherever in it the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("app", sorted(BELOW))
def test_an_app_never_imports_the_layers_above_it(app: str) -> None:
    wrong = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(BELOW[app]))
        for path in (ROOT / app).rglob("*.py")
    }
    assert {name: above for name, above in wrong.items() if above} == {}
