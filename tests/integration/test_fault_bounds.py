"""The database and the broker never hang a web request, and an outage loses no work.

Everything is real and private to this module: a PostgreSQL 15 cluster and a Redis of
its own (``tests.support.private_services``: the shared services are never touched),
gunicorn with two workers, a Celery worker of both queues and beat, a webhook receiver.

* PostgreSQL restarted under gunicorn: once it is back, no request fails (before
  ``CONN_HEALTH_CHECKS`` each worker's first request found its connection dead); a
  request in the restart window answers a clean 503, never a 500.
* A statement held past ``SETTLE_DB_STATEMENT_TIMEOUT_MS`` (here: behind a lock another
  session holds) is cut, and the request answers 503 with a code, not a hang or a 500.
* Redis hung (``DEBUG SLEEP``) and Redis stopped: every host-API call answers within
  2 s, and so does a bulk submission (one publish at most); once Redis is back the
  webhooks those commits wrote are delivered and the batch runs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.celery_procs import REPO_ROOT, Proc, beat_start, child_environment, worker_start
from harness.gunicorn import GunicornServer, gunicorn_start, gunicorn_stop
from harness.providers import sqlite_provider_init
from tests.support.private_services import (
    PG_BIN,
    PrivatePostgres,
    PrivateRedis,
    postgres_running,
    redis_private_running,
)
from tests.support.webhook_receiver import Receiver, receiver_serve

pytestmark = [pytest.mark.processes]

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}
PASSWORD = "a-long-console-password-1"
API_BOUND = 2.0  # every host-API call while the broker is hung or gone
QUEUE = "settle-fault-bounds"
HOLDER = "?application_name=settle-lock-holder"
HANG = 6  # seconds of DEBUG SLEEP
BULK = 40  # operations of the bulk batch: 8 chunks of SETTLE_BULK_CHUNK

SETUP = """
import json
from common.actors import COMMAND_LINE
from approvals.services.approvers import approver_create
from django.contrib.auth import get_user_model
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from webhooks.endpoints import webhook_endpoint_add
_, host = host_create(name="fleet-a")
_, approver = approver_create(name="phone", all_providers=True)
provider_configure(name="ledger", adapter="sqlite", path={path!r}, timeout_seconds=5)
get_user_model().objects.create_superuser("boss", "boss@example.com", {password!r})
webhook_endpoint_add(host_name="fleet-a", url={url!r}, actor=COMMAND_LINE)
print(json.dumps({{"host": host, "approver": approver}}))
"""


def _manage(env: dict[str, str | None], *args: str, timeout: float = 120.0) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=child_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"manage.py {args[0]} failed:\n{result.stderr[-3000:]}"
    return result.stdout


@dataclass
class Cluster:
    """The module's PostgreSQL, with a migrated and seeded template each test copies, and
    the webhook receiver of the template's endpoint."""

    postgres: PrivatePostgres
    receiver: Receiver
    ledger: Path
    host: str
    approver: str
    copies: int = 0

    def database(self) -> str:
        self.copies += 1
        name = f"settle_{self.copies}"
        self.postgres.psql(f'CREATE DATABASE "{name}" TEMPLATE settle_template')
        return self.postgres.url(name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module: migrating costs 15 s, copying the result a fraction."""
    directory = tmp_path_factory.mktemp("fault-bounds")
    ledger = directory / "ledger.sqlite3"
    sqlite_provider_init(ledger)
    serving = receiver_serve(Receiver())
    receiver = next(serving)
    try:
        with postgres_running() as postgres:
            env: dict[str, str | None] = {
                "DATABASE_URL": postgres.createdb("settle_template"),
                "CELERY_BROKER_URL": "memory://",
                "SETTLE_VAR_DIR": str(directory),
                "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
            }
            _manage(env, "migrate", "-v", "0")
            setup = SETUP.format(path=str(ledger), password=PASSWORD, url=receiver.url)
            made = json.loads(_manage(env, "shell", "-c", setup).strip().splitlines()[-1])
            yield Cluster(postgres, receiver, ledger, made["host"], made["approver"])
    finally:
        with contextlib.suppress(StopIteration):
            next(serving)


@dataclass
class Stack:
    """Gunicorn and Celery on a fresh copy of the database and the test's own Redis."""

    postgres: PrivatePostgres
    redis: PrivateRedis
    env: dict[str, str | None]
    directory: Path
    host: str = ""
    approver: str = ""
    web: GunicornServer | None = None
    procs: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.web is not None
        return self.web.url

    def web_start(self, workers: int = 2, **extra: str) -> None:
        self.web = gunicorn_start(
            database_url=str(self.env["DATABASE_URL"]),
            log_path=self.directory / "gunicorn.log",
            workers=workers,
            env={**self.env, **extra},
        )

    def celery_start(self) -> None:
        queues = f"{QUEUE},{QUEUE}-webhooks"
        self.procs.append(
            worker_start(
                log_path=self.directory / "worker.log", env=self.env, queues=queues, concurrency=2
            )
        )
        beat = self.directory / "beat"
        beat.mkdir(exist_ok=True)
        self.procs.append(beat_start(directory=beat, env=self.env))

    def supervised(self) -> list[str]:
        """Start again the Celery processes if one ended, as a process supervisor would.

        kombu's Redis transport can end a worker on a connection reset while it closes
        its channels (an ``AttributeError`` in ``_connparams``); deployments run workers
        under a supervisor that restarts them. A worker that logged its unrecoverable
        error may not have exited yet. What ended is returned, to be printed.
        """
        exited = [
            proc.name
            for proc in self.procs
            if proc.process.poll() is not None or "Unrecoverable error" in proc.log()
        ]
        if exited:
            for proc in self.procs:
                proc.kill()
            self.procs.clear()
            self.celery_start()
        return exited

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()  # the test is over: nothing of theirs to finish
        if self.web is not None:
            gunicorn_stop(self.web)

    def api(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
            trust_env=False,
        )

    def console(self) -> httpx.Client:
        """A signed-in console session (the superuser)."""
        client = httpx.Client(base_url=self.url, timeout=30.0, trust_env=False)
        client.get("/login/")
        response = client.post(
            "/login/",
            data={
                "login": "boss",
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        assert response.status_code == 302, response.text[:500]
        return client


@pytest.fixture
def stack(cluster: Cluster, tmp_path: Path) -> Iterator[Stack]:
    with redis_private_running() as redis:
        url = cluster.database()
        env: dict[str, str | None] = {
            "DATABASE_URL": url,
            "CELERY_BROKER_URL": redis.url(),
            "SETTLE_CELERY_QUEUE": QUEUE,
            "SETTLE_WEBHOOK_QUEUE": f"{QUEUE}-webhooks",
            "SETTLE_VAR_DIR": str(tmp_path / "var"),
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(tmp_path / "checkpoints.jsonl"),
            "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
            "SETTLE_SWEEP_SECONDS": "1",
            "SETTLE_WEBHOOK_SECONDS": "1",
            "SETTLE_BULK_LEASE_SECONDS": "2",
            "SETTLE_BULK_RESUME_SECONDS": "1",
            "SETTLE_BULK_CHUNK": "5",
            "SETTLE_CONSOLE_URL": "http://127.0.0.1",
        }
        running = Stack(cluster.postgres, redis, env, tmp_path, cluster.host, cluster.approver)
        try:
            yield running
        finally:
            running.stop()
            with contextlib.suppress(RuntimeError):
                cluster.postgres.psql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{url.rsplit('/', 1)[1]}'"
                )


def _timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = call()
    return time.monotonic() - started, response


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout} s: {what}")
        time.sleep(0.2)


def _released(host: httpx.Client, approver: httpx.Client, key: str) -> list[float]:
    """Register, approve, dispatch and report ``key`` committed; each call's seconds."""
    seconds: list[float] = []

    def call(method: str, client: httpx.Client, path: str, body: Any = None) -> dict[str, Any]:
        took, response = _timed(lambda: client.request(method, path, json=body))
        seconds.append(took)
        assert response.status_code in {200, 201}, (path, response.status_code, response.text)
        return dict(response.json())

    call(
        "POST",
        host,
        "/api/v1/operations",
        {"key": key, "action": "payment.send", "provider": "ledger", "params": PARAMS},
    )
    approval = call("POST", host, f"/api/v1/operations/{key}/approvals")
    path = f"/api/v1/approvals/{approval['approval_id']}"
    reviewed = call("GET", approver, path)
    digest = reviewed["params_digest"]
    call(
        "POST",
        approver,
        f"{path}/decision",
        {"decision": "approve", "ttl_seconds": 300, "params_digest": digest},
    )
    held = call(
        "POST",
        host,
        f"/api/v1/operations/{key}/dispatch",
        {"worker": "w1", "params_digest": digest},
    )
    call(
        "POST",
        host,
        f"/api/v1/operations/{key}/result",
        {"fencing_token": held["fencing_token"], "outcome": "committed"},
    )
    call("GET", host, f"/api/v1/operations/{key}")
    return seconds


# -- PostgreSQL -------------------------------------------------------------------------


def test_no_request_fails_after_postgresql_restarts_under_gunicorn(stack: Stack) -> None:
    stack.web_start(workers=2)
    host = stack.api(stack.host)
    approver = stack.api(stack.approver)
    _released(host, approver, "before-restart")
    console = stack.console()
    pages = ["/", "/operations/before-restart/", "/batches/"]

    def fetch(n: int) -> int:
        if n % 2:
            return host.get("/api/v1/operations/before-restart").status_code
        return console.get(pages[n % len(pages)]).status_code

    # Every worker holds a connection (CONN_MAX_AGE) before the restart cuts them all.
    assert all(fetch(n) == 200 for n in range(30))
    stack.postgres.restart()
    after = [fetch(n) for n in range(24)]
    assert after == [200] * 24, f"after the restart: {after}"

    # Under load, in the window itself the database is gone for a moment: a request
    # then answers a clean 503, never a 500; once it is back, every one succeeds again.
    during: list[int] = []
    stop = threading.Event()

    def load() -> None:
        n = 0
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                during.append(fetch(n))
            n += 1

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(0.5)
    stack.postgres.restart()
    time.sleep(0.5)
    stop.set()
    thread.join(timeout=30)
    after = [fetch(n) for n in range(24)]
    print(f"restart under load: {len(during)} requests, statuses {sorted(set(during))}")
    assert set(during) <= {200, 503}, f"during the restart: {sorted(set(during))}"
    assert after == [200] * 24, f"after the restart under load: {after}"


def test_a_statement_held_past_its_timeout_answers_503_not_a_hang(stack: Stack) -> None:
    stack.web_start(workers=2, SETTLE_DB_STATEMENT_TIMEOUT_MS="1500", SETTLE_DB_LOCK_TIMEOUT_MS="0")
    host = stack.api(stack.host)
    approver = stack.api(stack.approver)
    _released(host, approver, "locked")
    console = stack.console()
    database = str(stack.env["DATABASE_URL"]).rsplit("/", 1)[1]
    # Another session holds every operation: any statement that reads one waits.
    holder = subprocess.Popen(
        [str(PG_BIN / "psql"), "-X", stack.postgres.url(database) + HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdin is not None
        holder.stdin.write(
            "BEGIN; LOCK TABLE recovery_operation IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60);\n"
        )
        holder.stdin.flush()
        time.sleep(1.0)
        took, api = _timed(lambda: host.get("/api/v1/operations/locked", timeout=10))
        took_page, page = _timed(lambda: console.get("/operations/locked/", timeout=10))
    finally:
        stack.postgres.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'settle-lock-holder'"
        )
        holder.kill()
        holder.wait(timeout=10)
    print(
        f"held statement: API {api.status_code} in {took:.2f} s, page {page.status_code} "
        f"in {took_page:.2f} s"
    )
    assert (api.status_code, api.json()["error"]) == (503, "database_unavailable"), api.text
    assert "in time" in api.json()["message"]
    assert took < 5.0, f"the API answered after {took:.1f} s"
    assert page.status_code == 503, page.status_code
    assert "Traceback" not in page.text
    assert took_page < 5.0, f"the page answered after {took_page:.1f} s"
    # The lock is gone and so is the problem.
    assert host.get("/api/v1/operations/locked").status_code == 200


# -- Redis ------------------------------------------------------------------------------


def test_a_hung_or_stopped_redis_holds_no_request_and_loses_no_work(
    stack: Stack, cluster: Cluster
) -> None:
    receiver = cluster.receiver

    def delivered() -> set[str]:
        with receiver.lock:
            return {json.loads(item.body)["data"]["operation"] for item in receiver.received}

    stack.web_start(workers=2)
    stack.celery_start()
    host = stack.api(stack.host)
    approver = stack.api(stack.approver)
    for n in range(BULK):
        body = {"key": f"bulk-{n}", "action": "payment.send", "provider": "ledger"}
        response = host.post("/api/v1/operations", json={**body, "params": PARAMS})
        assert response.status_code == 201, response.text
    database = str(stack.env["DATABASE_URL"]).rsplit("/", 1)[1]
    picks = stack.postgres.psql(
        "SELECT id || '.' || version FROM recovery_operation WHERE key LIKE 'bulk-%'",
        database,
    ).split()
    console = stack.console()
    _released(host, approver, "warm")  # both web workers have published once
    _released(host, approver, "warm-2")
    _wait(lambda: {"warm", "warm-2"} <= delivered(), 30, "the warm-up webhooks")

    # Every commit of a release publishes a webhook delivery: each waits on Redis.
    slowest: dict[str, float] = {}
    with stack.redis.hung(seconds=HANG):
        for n in range(2):
            slowest[f"hung-{n}"] = max(_released(host, approver, f"hung-{n}"))
    stack.redis.stop()
    for n in range(2):
        slowest[f"down-{n}"] = max(_released(host, approver, f"down-{n}"))
    submission = {
        "op": picks,
        "action": "confirm",
        "why": "the outage drill",
        "csrfmiddlewaretoken": console.cookies["csrftoken"],
    }
    slowest["bulk"], response = _timed(lambda: console.post("/bulk/", data=submission))
    assert response.status_code == 302, response.text[:2000]
    stack.redis.start()
    print(f"slowest call with Redis hung or stopped (s): {slowest}")
    print(f"Celery processes that exited and were started again: {stack.supervised()}")

    slow = {key: round(took, 2) for key, took in slowest.items() if took > API_BOUND}
    assert not slow, f"calls slower than {API_BOUND} s with Redis hung or down: {slow}"

    # Nothing is lost: the webhooks those commits wrote arrive, the batch runs.
    keys = {"hung-0", "hung-1", "down-0", "down-1"}
    _wait(lambda: keys <= delivered(), 60, f"webhooks of {sorted(keys - delivered())}")

    def finished() -> bool:
        status = stack.postgres.psql("SELECT status FROM console_bulkbatch", database)
        return status.split() == ["finished"]

    _wait(finished, 60, "the batch finished once Redis was back")
    pending = stack.postgres.psql(
        "SELECT count(*) FROM console_bulkitem WHERE status = 'pending'", database
    )
    assert pending.strip() == "0"
