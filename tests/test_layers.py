"""Imports point one way, down this list: an app imports only the apps below it.

``common`` (canonical JSON and digests, the error codes, outbound HTTP) and ``dbsql`` (hand-written
SQL) are infrastructure under every app and import none. ``audit`` sits under the operation
core, which writes its events in the same transaction as each change. The core
(``recovery``) imports none of its consumers: it records what changed
(``recovery.changes``) and they decide what it means to them. The project package
(``settle``: settings, URLs, the Celery app, WSGI) wires them all together and stands above
them; no app imports it.
``bench`` and ``tests``, which a production install does not have, stand above them
all: they may import anything, and nothing shipped imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.imports import top_level_imports

ROOT = Path(__file__).resolve().parents[1]
# Top first; "bench" and "tests" stand above them all.
LAYERS = [
    "bench",
    "tests",
    "settle",
    "console",
    "bulk",
    "identity",
    "monitoring",
    "webhooks",
    "recovery",
    "policies",
    "audit",
    "approvals",
    "dbsql",
    "common",
]
ABOVE = {app: LAYERS[: LAYERS.index(app)] for app in LAYERS}
SHIPPED = LAYERS[2:]


@pytest.mark.parametrize("app", SHIPPED)
def test_an_app_never_imports_the_layers_above_it(app: str) -> None:
    assert (ROOT / app).is_dir()
    wrong = {
        str(path.relative_to(ROOT)): sorted(top_level_imports(path) & set(ABOVE[app]))
        for path in (ROOT / app).rglob("*.py")
    }
    assert {name: above for name, above in wrong.items() if above} == {}


def _conftest_imports(path: Path) -> list[str]:
    """The imports in a module that name a conftest module, wherever in it they stand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            modules = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        if any("conftest" in module.split(".") for module in modules):
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("folder", ["tests", "clients/python/tests"])
def test_no_test_module_imports_from_a_conftest(folder: str) -> None:
    """Conftest files hold fixtures and hooks, which pytest finds by name; anything a test
    imports lives in a module of its own (``tests/support``), so it has one name."""
    assert (ROOT / folder).is_dir()
    wrong = {
        str(path.relative_to(ROOT)): _conftest_imports(path)
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {name: imports for name, imports in wrong.items() if imports} == {}


def _test_module_imports(path: Path, root: Path) -> list[str]:
    """The imports in a module that name a test module (``test_*``), wherever they stand.

    ``from package import name`` names a test module only if ``name`` is a module file
    there: ``tests.support.celery_fixtures.test_database_url`` is a fixture, not one.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = path.parents[node.level - 1] if node.level else root
            parts = (node.module or "").split(".") if node.module else []
            package = base.joinpath(*parts)
            modules = [parts] + [
                [*parts, alias.name]
                for alias in node.names
                if (package / f"{alias.name}.py").is_file() or (package / alias.name).is_dir()
            ]
        else:
            continue
        if any(part.startswith("test_") for module in modules for part in module):
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize(
    ("folder", "root"), [("tests", "."), ("clients/python/tests", "clients/python")]
)
def test_no_module_imports_from_a_test_module(folder: str, root: str) -> None:
    """A helper two test modules share lives in ``tests/support`` (a fixture in the nearest
    conftest): importing a test module runs its module-level code and, under its name, can
    bring its tests and fixtures into the importer's namespace."""
    assert (ROOT / folder).is_dir()
    wrong = {
        str(path.relative_to(ROOT)): _test_module_imports(path, ROOT / root)
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {name: imports for name, imports in wrong.items() if imports} == {}
