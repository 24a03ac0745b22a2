"""Imports point one way: console → monitoring → webhooks → recovery → audit → approvals
→ dbsql.

``dbsql``, the hand-written SQL, is infrastructure under every app and imports none. An
app folder not there yet (the layering is being reached one app at a time) has nothing
to check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BELOW = {
    "dbsql": ("approvals", "audit", "recovery", "webhooks", "monitoring", "console"),
    "approvals": ("audit", "recovery", "webhooks", "monitoring", "console"),
    "audit": ("recovery", "webhooks", "monitoring", "console"),
    "recovery": ("webhooks", "monitoring", "console"),
    "webhooks": ("monitoring", "console"),
    "monitoring": ("console",),
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
    if not (ROOT / app).is_dir():
        pytest.skip(f"no {app}/ on this branch yet")
    wrong = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(BELOW[app]))
        for path in (ROOT / app).rglob("*.py")
    }
    assert {name: above for name, above in wrong.items() if above} == {}
