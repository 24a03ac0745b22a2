"""The client library's tests are all in clients/python/tests, and each runs somewhere.

Settle's suite (the top pyproject.toml's testpaths) runs those that need no live server;
the client's own venv (clients/python/pyproject.toml's, run by ``.ci/run`` against a live
Settle) those that need only the client. A module neither lists would never run, and one
the client's venv lists must not import Settle's code, which that venv does not have.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.imports import top_level_imports

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "python"


def _pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def _test_modules(folder: Path) -> set[Path]:
    """The test modules a run from ``folder`` collects when given no paths."""
    found = set()
    for name in _pyproject(folder)["tool"]["pytest"]["ini_options"]["testpaths"]:
        path = (folder / name).resolve()
        found |= set(path.rglob("test_*.py")) if path.is_dir() else {path}
    return found


def test_every_client_test_module_is_run_by_one_of_the_two_runs() -> None:
    modules = {path.resolve() for path in (CLIENT / "tests").glob("test_*.py")}
    listed = _test_modules(ROOT) | _test_modules(CLIENT)
    assert modules, "no client tests found"
    assert sorted(str(path.relative_to(ROOT)) for path in modules - listed) == []
    assert {path for path in listed if CLIENT in path.parents} <= modules


def test_the_client_venv_runs_no_module_that_needs_settle() -> None:
    settle = {*_pyproject(ROOT)["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]}
    settle |= {"django", "tests", "bench", "harness"}
    wrong = {}
    for path in _test_modules(CLIENT):
        wrong[path.name] = sorted(top_level_imports(path) & settle)
    assert {name: found for name, found in wrong.items() if found} == {}
