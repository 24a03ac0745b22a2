"""Imports point one way, down this list: an app imports only the apps below it.

``common`` (canonical JSON and digests, the error codes, outbound HTTP, the actor type,
credentials' rules, the read-only admin base, the statement a person signs and its passkey
check) and ``dbsql`` (hand-written SQL) are infrastructure under every app and import none.
``audit`` stands on them alone; ``approvals`` (approvals and permits) above it, and the
operation core above both, which writes its events in the same transaction as each
change. The core (``recovery``) imports none of its consumers: it records what changed
(``recovery.changes``) and they decide what it means to them. The project package
(``settle``: settings, URLs, the Celery app, WSGI) wires them all together and stands above
them; no app imports it.
``bench`` and ``tests``, which a production install does not have, stand above them
all: they may import anything, and nothing shipped imports them. ``harness`` (the real
servers, processes and authenticators both start) stands under them and over every app:
``bench`` and ``harness`` import nothing from ``tests``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.imports import top_level_imports

ROOT = Path(__file__).resolve().parents[1]
# Top first; "bench", "tests" and "harness" stand above them all, and are not shipped.
LAYERS = [
    "bench",
    "tests",
    "harness",
    "settle",
    "console",
    "customers",
    "bulk",
    "identity",
    "monitoring",
    "webhooks",
    "recovery",
    "policies",
    "approvals",
    "audit",
    "dbsql",
    "common",
]
ABOVE = {app: LAYERS[: LAYERS.index(app)] for app in LAYERS}
SHIPPED = LAYERS[LAYERS.index("harness") + 1 :]
# Test modules: longer than a shipped module, but one concern each.
TEST_MODULE_LINES = 1000
SHIPPED_MODULE_LINES = 500


# Landed migrations name the actor type by the path it had (``approvals.actors``, now an
# alias of ``common.actors``) and are never edited: from a migration, that module alone
# may be imported whatever the layers.
MIGRATIONS_MAY_IMPORT = "approvals.actors"


def _imports(path: Path) -> set[str]:
    """The apps ``path`` imports, less ``MIGRATIONS_MAY_IMPORT`` if it is a migration."""
    found = top_level_imports(path)
    if "migrations" not in path.relative_to(ROOT).parts:
        return found
    app = MIGRATIONS_MAY_IMPORT.split(".")[0]
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    if {module for module in modules if module.split(".")[0] == app} == {MIGRATIONS_MAY_IMPORT}:
        found.discard(app)
    return found


@pytest.mark.parametrize("app", SHIPPED)
def test_an_app_never_imports_the_layers_above_it(app: str) -> None:
    assert (ROOT / app).is_dir()
    wrong = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(ABOVE[app]))
        for path in (ROOT / app).rglob("*.py")
    }
    assert {name: above for name, above in wrong.items() if above} == {}


@pytest.mark.parametrize("layer", ["bench", "harness"])
def test_bench_and_harness_import_nothing_from_tests(layer: str) -> None:
    """What the benchmarks share with the tests lives in ``harness``, under both."""
    wrong = {
        str(path.relative_to(ROOT)): sorted(top_level_imports(path) & {"tests", "bench"} - {layer})
        for path in (ROOT / layer).rglob("*.py")
    }
    assert {name: above for name, above in wrong.items() if above} == {}


def _lines(path: Path) -> int:
    with path.open("rb") as handle:
        return sum(1 for _ in handle)


def test_no_test_module_passes_a_thousand_lines() -> None:
    modules = [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "clients/python/tests").glob("*.py")]
    assert modules
    long = {str(path.relative_to(ROOT)): _lines(path) for path in modules}
    assert {name: n for name, n in long.items() if n > TEST_MODULE_LINES} == {}


def test_no_shipped_module_passes_five_hundred_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): _lines(path)
        for folder in [*SHIPPED, "clients/python/src"]
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts
    }
    assert {name: n for name, n in long.items() if n > SHIPPED_MODULE_LINES} == {}


def _names_module(path: Path, module: str) -> bool:
    """Whether ``path`` imports ``module`` (or a name from it), wherever the import stands."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(alias.name == module for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
            return True
    return False


def test_only_landed_migrations_name_the_actor_types_older_path() -> None:
    """New code imports ``common.actors``; ``approvals.actors`` stays for the migrations."""
    wrong = [
        str(path.relative_to(ROOT))
        for app in LAYERS
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
        and _names_module(path, MIGRATIONS_MAY_IMPORT)
    ]
    assert wrong == []


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


def _package_style() -> dict[str, bool]:
    """Each shipped package, and whether its ``__init__`` re-exports its modules' names."""
    found = {}
    for app in SHIPPED:
        for init in (ROOT / app).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(ROOT).parts)
            found[package] = any(
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + ".")
                for node in ast.parse(init.read_text()).body
            )
    return found


def test_a_name_is_imported_one_way() -> None:
    """From the package that re-exports it, or from the module that defines it; not both."""
    style = _package_style()
    assert style["recovery.adapters"] and not style["recovery.selectors"]
    wrong = []
    for folder in [*SHIPPED, "tests", "bench", "harness"]:
        for path in (ROOT / folder).rglob("*.py"):
            where = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                    continue
                parent = node.module.rpartition(".")[0]
                if style.get(parent) and not where.startswith(parent + "."):
                    wrong.append(f"{where}: from {node.module} (use {parent})")
                if style.get(node.module) is False:
                    package = ROOT.joinpath(*node.module.split("."))
                    names = [a.name for a in node.names if not (package / f"{a.name}.py").exists()]
                    names = [n for n in names if not (package / n).is_dir()]
                    if names:
                        wrong.append(f"{where}: {names} from {node.module} (use its modules)")
    assert wrong == []
