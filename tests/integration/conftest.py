"""Fixtures for the crash and race scenarios: a live server, real worker processes, providers.

Workers are separate OS processes (``tests/procs/worker.py``) that reach Settle only over
HTTP, through pytest-django's ``live_server``. Resume never looks a provider up itself:
it queues the lookup for a background worker, so the tests that recover from a crash run
a real Celery worker (``lookup_worker``, one for the whole session: starting and
stopping one costs about 3.5 s) and poll resume as a host does. Every process started
here is killed and reaped at teardown, and every wait is bounded, so a hang fails the
test instead of CI.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_django.live_server_helper import LiveServer

from approvals.services.approvers import approver_create
from harness.celery_procs import queue_name, worker_start
from harness.providers import http_provider_start, http_provider_stop, sqlite_provider_init
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.celery_fixtures import queue_delete, test_database_url
from tests.support.live import (
    Http,
    LookupWorker,
    Procs,
    ProviderHandle,
    Settle,
    live_server_wide,
)


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """pytest-django's live server (threaded, real HTTP), with a wider listen backlog."""
    server = live_server_wide(request)
    yield server
    server.stop()


@pytest.fixture
def settle(live_server: Any) -> Settle:
    _, host_token = host_create(name="fleet-a")
    _, approver_token = approver_create(name="alice-phone", all_providers=True)
    base = live_server.url
    return Settle(base, Http(base, host_token), Http(base, approver_token), host_token)


@pytest.fixture
def make_provider(tmp_path: Path, transactional_db: None) -> Iterator[Any]:
    """``make_provider(kind, lease_seconds=1)`` → a configured provider of that adapter."""
    servers: list[subprocess.Popen[str]] = []

    def make(
        kind: str, *, lease_seconds: int = 1, secret: str = "", lookup_budget: int = 5
    ) -> ProviderHandle:
        name = f"orders-{kind}"
        path = url = ""
        if kind == "sqlite":
            path = str(tmp_path / "orders.sqlite3")
            sqlite_provider_init(path)
        elif kind == "journal":
            path = str(tmp_path / "journal.jsonl")
            Path(path).touch()
        elif kind == "http":
            secret = secret or "http-provider-secret"
            process, url = http_provider_start(tmp_path, secret)
            servers.append(process)
        else:
            raise ValueError(kind)
        handle = ProviderHandle(kind, name, path=path, url=url, secret=secret)
        provider_configure(
            name=name,
            adapter=kind,
            path=path,
            url=url,
            secret=secret,
            lease_seconds=lease_seconds,
            timeout_seconds=5,
            lookup_budget=lookup_budget,
        )
        return handle

    yield make
    for process in servers:
        http_provider_stop(process)


@pytest.fixture(scope="session")
def _lookup_worker_session(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LookupWorker]:
    """One worker for the whole session (its pool: four processes, for concurrent lookups).

    Tests share it, each on its own database contents: a message left behind by an
    earlier test names an attempt that no longer exists, and does nothing.
    """
    directory = tmp_path_factory.mktemp("lookup-worker")
    queue = queue_name()
    env = {
        "DATABASE_URL": test_database_url(),
        "SETTLE_CELERY_QUEUE": queue,
        "SETTLE_AUDIT_CHECKPOINT_FILE": str(directory / "checkpoints.jsonl"),
    }
    proc = worker_start(log_path=directory / "worker.log", env=env, concurrency=4, name="lookups")
    try:
        yield LookupWorker(proc, queue)
    finally:
        proc.stop()
        queue_delete(queue)
        queue_delete(f"{queue}-webhooks")  # where its processes' commits nudge deliveries


@pytest.fixture
def lookup_worker(_lookup_worker_session: LookupWorker, settings: Any) -> LookupWorker:
    """The session's lookup worker, and this process (the live server) publishing to it."""
    worker = _lookup_worker_session
    if worker.proc.process.poll() is not None:
        raise AssertionError(f"the lookup worker died:\n{worker.proc.log()[-4000:]}")
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue  # read by lookup_publish at each call
    return worker


@pytest.fixture
def procs(settle: Settle, tmp_path: Path) -> Iterator[Procs]:
    directory = tmp_path / "workers"
    directory.mkdir()
    manager = Procs(settle, directory)
    try:
        yield manager
    finally:
        manager.cleanup()
