"""The production install: worker, beat and web server from a venv with runtime dependencies only.

The suite itself runs from the dev venv (editable install, dev extras), which can hide a
runtime dependency that only a dev tool brings along: kombu's Redis transport needs
``packaging``, which only ``celery[redis]`` declares. CI (``.ci/run``) therefore builds a
second venv with ``pip install .`` (no extras, not editable) and names it in
``SETTLE_RUNTIME_VENV``; this test runs that venv's ``celery`` from outside the checkout,
so the workers and beat import the installed package, and lets them settle a stranded
operation with nobody calling resume and deliver its webhooks (a worker of the webhook
queue, as docs/deploying.md's deployment runs one); and that venv's gunicorn serves the
console's pages and static files, which must ship inside the package. The benchmarks
(``bench/``, its ``benchmark_*`` commands and ``sqlcount``) must not.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.actors import COMMAND_LINE
from harness.celery_procs import REPO_ROOT, child_environment
from harness.gunicorn import _LOCAL, database_url, gunicorn_running
from tests.support.live import (
    Procs,
    Settle,
    assert_audit_intact,
    assert_nobody_resumed,
    assert_recovered_receipt,
    crash,
    state_of,
    wait_until,
)
from tests.support.strict import STRICT
from tests.support.webhook_receiver import Receiver, receiver_serve
from webhooks.endpoints import webhook_endpoint_add

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def runtime_venv() -> Path:
    """The runtime venv: CI's run on PostgreSQL must give it; elsewhere the test skips.

    CI's first run, as on a fresh machine, has no venv of the production install.
    """
    venv = os.environ.get("SETTLE_RUNTIME_VENV", "")
    if not venv:
        reason = "SETTLE_RUNTIME_VENV names no venv made with `pip install .` (.ci/run makes one)"
        if STRICT:
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(venv)


@pytest.fixture
def runtime_celery(celery_env: dict[str, str | None], runtime_venv: Path) -> Path:
    """The runtime venv's ``celery``."""
    celery = runtime_venv / "bin" / "celery"
    assert celery.exists(), f"{celery} does not exist"
    return celery


def _imported_from(python: Path, cwd: Path, env: dict[str, str | None]) -> dict[str, str]:
    """Where that interpreter, started as the worker was, finds Settle's packages."""
    code = (
        "import approvals, console, recovery, settle; "
        "print(console.__file__, recovery.__file__, settle.__file__)"
    )
    output = _output([str(python), "-c", code], cwd, env).split()
    return {"console": output[0], "recovery": output[1], "settle": output[2]}


def _output(command: list[str], cwd: Path, env: dict[str, str | None]) -> str:
    return subprocess.run(
        command,
        cwd=cwd,
        env=child_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def _outside_the_checkout(tmp_path: Path, settings: Any) -> tuple[Path, dict[str, str | None]]:
    """A working directory with nothing to import, and what an installed process is given."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env: dict[str, str | None] = {
        "PYTHONPATH": None,
        "SETTLE_VAR_DIR": str(tmp_path / "var"),  # an installed package has no var/ beside it
        "SECRET_KEY": str(settings.SECRET_KEY),
        "SETTLE_AUDIT_KEY": str(settings.SETTLE_AUDIT_KEY),
    }
    return outside, env


def test_a_runtime_only_install_releases_a_stranded_operation_and_delivers_its_webhook(
    runtime_celery: Path,  # first: without the venv, skip (or fail) before anything starts
    settle: Settle,
    procs: Procs,
    make_provider: Any,
    receiver: Receiver,
    celery_env: dict[str, str | None],
    celery_procs: Any,
    tmp_path: Path,
    settings: Any,
) -> None:
    outside, installed = _outside_the_checkout(tmp_path, settings)
    env = {**celery_env, **installed, "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true"}
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    settings.SETTLE_WEBHOOK_QUEUE = celery_env["SETTLE_WEBHOOK_QUEUE"]  # the live server's nudges
    venv = runtime_celery.parent.parent
    where = _imported_from(runtime_celery.with_name("python"), outside, env)
    for package, path in where.items():
        assert Path(path).is_relative_to(venv), (package, path)
        assert not Path(path).is_relative_to(REPO_ROOT), (package, path)

    provider = make_provider("sqlite", lease_seconds=1)
    _, secret = webhook_endpoint_add(host_name="fleet-a", url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    worker = celery_procs("worker", env, celery=str(runtime_celery), cwd=outside)
    webhooks = celery_procs("webhooks", env, celery=str(runtime_celery), cwd=outside)
    beat = celery_procs("beat", env, celery=str(runtime_celery), cwd=outside)
    for proc in (worker, webhooks, beat):
        assert os.readlink(f"/proc/{proc.pid}/cwd") == str(outside)
        assert str(runtime_celery) in Path(f"/proc/{proc.pid}/cmdline").read_text()
    assert "transport:   redis://" in worker.log()

    key = "installed-commit"
    settle.approved(key, provider.name)
    crash(procs, key, provider, "after_effect")  # dispatched, receipt running, effect committed
    wait_until(lambda: state_of(key) == "released", 30, f"{key} released by the installed worker")

    assert provider.effects(key) == 1
    assert_recovered_receipt(key)
    assert_nobody_resumed(key)
    assert_audit_intact()

    def released_received() -> bool:
        types = [json.loads(item.body)["type"] for item in receiver.received]
        return "operation.released" in types

    wait_until(released_received, 30, "the release delivered by the installed webhook worker")
    assert all(item.verified[secret] for item in receiver.received)
    assert "Task webhooks.tasks.webhooks_deliver[" in webhooks.log()
    assert "Task webhooks.tasks.webhooks_deliver[" not in worker.log()
    assert "Traceback" not in worker.log() + webhooks.log() + beat.log()


def test_a_runtime_only_install_serves_the_console_pages_and_static_files(
    runtime_celery: Path, tmp_path: Path, settings: Any
) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the installed gunicorn is given the PostgreSQL test database")
    outside, env = _outside_the_checkout(tmp_path, settings)
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=1,
        env=env,
        executable=str(runtime_celery.with_name("gunicorn")),
        cwd=outside,
    ) as server:
        with _LOCAL.open(server.url + "/login/", timeout=10) as response:
            page = response.read().decode()
        assert response.status == 200 and 'name="password"' in page
        for path in ("/static/settle/settle.css", "/static/vendor/htmx-2.0.11.min.js"):
            with _LOCAL.open(server.url + path, timeout=10) as response:
                assert response.status == 200 and response.read(), path
        assert "Traceback" not in server.log_tail()


def test_a_runtime_only_install_has_no_benchmarks(
    runtime_venv: Path, tmp_path: Path, settings: Any
) -> None:
    outside, env = _outside_the_checkout(tmp_path, settings)
    code = (
        "import importlib.metadata, importlib.util, json; print(json.dumps(["
        "[str(path) for path in importlib.metadata.files('settle')], "
        "importlib.util.find_spec('bench') is not None]))"
    )
    files, bench_found = json.loads(
        _output([str(runtime_venv / "bin" / "python"), "-c", code], outside, env)
    )
    assert "audit/management/commands/verify_audit.py" in files  # the list is the wheel's
    benchmarks = [
        path
        for path in files
        if path.startswith("bench/") or "benchmark_" in path or path.endswith("sqlcount.py")
    ]
    assert benchmarks == []
    assert not bench_found

    django_admin = str(runtime_venv / "bin" / "django-admin")
    commands = _output([django_admin, "help", "--commands"], outside, env).split()
    assert "verify_audit" in commands
    assert [name for name in commands if name.startswith("benchmark_")] == []
