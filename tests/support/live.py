"""The crash and race scenarios' tools: a JSON client and the API's roles over real HTTP,
providers seen from outside, worker processes that print JSON lines, and shared checks.

Their fixtures (the live server, ``settle``, ``make_provider``, ``lookup_worker``,
``procs``) are in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import settle_client
from django.core.servers.basehttp import ThreadedWSGIServer

from approvals.models import Permit
from approvals.selectors import permit_history
from approvals.services.approvers import approver_create
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from dbsql.clock import db_now
from harness.celery_procs import Proc
from harness.providers import digest_of, http_provider_history, sqlite_provider_init
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation, Provider, Verdict
from recovery.services.credentials import host_create
from recovery.services.lookups import SWEEPER_ACTOR
from recovery.services.providers import provider_configure
from tests.support.flow import PARAMS

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = REPO_ROOT / "tests" / "procs" / "worker.py"

WAIT = 30.0  # the bound on any single wait for a worker
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- a fleet's credentials and the orders provider, for a server of the test's own ----


def fleet_and_orders(tmp_path: Path, **provider: Any) -> tuple[str, str, Path]:
    """A host's and an approver's tokens, and the ``orders`` provider (a SQLite database
    in ``tmp_path``, configured with ``provider``'s options): ``(host, approver, path)``."""
    _, host_token = host_create(name="fleet-a")
    _, approver_token = approver_create(name="alice-phone", all_providers=True)
    orders = tmp_path / "orders.sqlite3"
    sqlite_provider_init(orders)
    provider_configure(name="orders", adapter="sqlite", path=str(orders), **provider)
    return host_token, approver_token, orders


# -- the live server ------------------------------------------------------------------


class WideBacklogServer(ThreadedWSGIServer):
    """Django's test server with a listen backlog that fits fifty simultaneous workers.

    Its default backlog of 10 makes the kernel reset connections when fifty processes
    connect at the same instant; a production server (gunicorn: 2048) would not.
    """

    request_queue_size = 256


def live_server_wide(request: Any) -> Any:
    """pytest-django's live server (threaded, real HTTP) with the wider backlog, started:
    the session fixture of the tests that drive it from other processes."""
    from pytest_django.live_server_helper import LiveServer

    addr = (
        request.config.getvalue("liveserver")
        or os.getenv("DJANGO_LIVE_TEST_SERVER_ADDRESS")
        or "localhost"
    )
    server = LiveServer(addr, start=False)
    server.thread.server_class = WideBacklogServer
    server.start()
    return server


# -- talking to the live server from the test process -------------------------------


@dataclass
class Http:
    """A tiny JSON client for the live server, holding one bearer token."""

    base_url: str
    token: str

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str
    ) -> tuple[int, dict[str, Any]]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": "application/json", **headers}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers=all_headers
        )
        try:
            with _DIRECT.open(request, timeout=WAIT) as response:
                status, payload = int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            status, payload = int(exc.code), exc.read()
            exc.close()
        return status, json.loads(payload)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        return self.request("POST", path, {} if body is None else body, **kwargs)

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        return self.request("GET", path)


@dataclass
class Settle:
    """The host and the approver, driving operations through the live server's API."""

    base_url: str
    host: Http
    approver: Http
    host_token: str

    def register(self, key: str, provider: str, params: dict[str, Any] = PARAMS) -> None:
        status, body = self.host.post(
            "/api/v1/operations",
            {"key": key, "action": "payment.send", "provider": provider, "params": params},
        )
        assert status == 201, body

    def approve(self, key: str, ttl_seconds: int = 300) -> dict[str, Any]:
        status, approval = self.host.post(f"/api/v1/operations/{key}/approvals")
        assert status == 201, approval
        path = f"/api/v1/approvals/{approval['approval_id']}"
        status, reviewed = self.approver.get(path)  # the approver sees the exact action
        assert status == 200, reviewed
        status, decided = self.approver.post(
            f"{path}/decision",
            {
                "decision": "approve",
                "ttl_seconds": ttl_seconds,
                "params_digest": reviewed["params_digest"],
            },
        )
        assert status == 200 and decided["status"] == "approved", decided
        return decided

    def approved(self, key: str, provider: str, params: dict[str, Any] = PARAMS) -> str:
        """Register and approve; return the permit id."""
        self.register(key, provider, params)
        return str(self.approve(key)["permit_id"])

    def resume(self, key: str, worker: str = "test") -> dict[str, Any]:
        status, body = self.host.post(f"/api/v1/operations/{key}/resume", {"worker": worker})
        assert status == 200, body
        return body

    def resume_polled(self, key: str, worker: str = "test") -> list[dict[str, Any]]:
        """Settle it through the library (``resume_polled``); every resume answer."""
        return resume_polled(self.base_url, self.host_token, key, worker)

    def record(self, key: str) -> dict[str, Any]:
        status, body = self.host.get(f"/api/v1/operations/{key}")
        assert status == 200, body
        return body


# -- providers --------------------------------------------------------------------------


@dataclass
class ProviderHandle:
    """One configured provider and the outside view of its record."""

    kind: str
    name: str
    path: str = ""
    url: str = ""
    secret: str = ""

    def worker_args(self) -> list[str]:
        args = ["--effect", self.kind]
        if self.path:
            args += ["--provider-path", self.path]
        if self.url:
            args += ["--provider-url", self.url]
        return args

    def effects(self, key: str) -> int:
        """How many effects the provider itself holds (or performed) for ``key``."""
        if self.kind == "sqlite":
            uri = f"file:{self.path}?mode=ro"
            connection = sqlite3.connect(uri, uri=True, timeout=10)
            try:
                row = connection.execute(
                    "SELECT count(*) FROM orders WHERE operation_key = ?", (key,)
                ).fetchone()
            finally:
                connection.close()
            return int(row[0])
        if self.kind == "journal":
            lines = Path(self.path).read_text("utf-8").splitlines()
            return sum(
                1 for line in lines if line.strip() and json.loads(line)["operation_key"] == key
            )
        return len(http_provider_history(self.url, key))

    @property
    def model(self) -> Provider:
        return Provider.objects.get(name=self.name)


# -- the background worker that runs the lookups resume queues ---------------------------


@dataclass
class LookupWorker:
    """A real ``celery -A settle worker`` on a queue of its own, against the test database."""

    proc: Proc
    queue: str


class Answers(httpx.HTTPTransport):
    """The real transport, keeping every answer ``settle_client`` received, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[tuple[str, int, dict[str, Any]]] = []  # (path, status, body)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.answers.append((request.url.path, response.status_code, response.json()))
        return response

    def resumes(self) -> list[dict[str, Any]]:
        return [body for path, _, body in self.answers if path.endswith("/resume")]


def resume_polled(
    base_url: str, host_token: str, key: str, worker: str = "test", timeout: float = WAIT
) -> list[dict[str, Any]]:
    """Settle ``key`` as a host does after a crash: ``settle_client.Host.run`` again.

    The library asks resume again after its ``retry_after`` while it is ``in_progress``,
    and must not be handed a dispatch (the effect fails the test). Returns every resume
    answer, the settled one last; fails if the library did not settle it in ``timeout``.
    """
    op = Operation.objects.select_related("provider").get(key=key)
    transport = Answers()

    def effect(fencing_token: str) -> None:
        raise AssertionError(f"resume handed out a second dispatch for {key}")

    with settle_client.Host(
        base_url, host_token, worker=worker, settle_timeout=timeout, transport=transport
    ) as host:
        try:
            outcome = host.run(
                key,
                action=op.action,
                provider=op.provider.name,
                params=json.loads(op.params_canonical),
                effect=effect,
            )
        except settle_client.SettleError as exc:
            raise AssertionError(f"{key}: {exc!r} after {transport.answers}") from exc
    assert not outcome.ran_effect, (outcome, transport.answers)
    return transport.resumes()


# -- worker processes ---------------------------------------------------------------------


class Worker:
    """One worker process; its stdout JSON lines are read by a thread into a queue."""

    def __init__(self, popen: subprocess.Popen[str], name: str, stderr_path: Path) -> None:
        self.popen = popen
        self.name = name
        self.stderr_path = stderr_path
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "garbage", "line": line}
            self._queue.put(event)
        self._queue.put(None)

    def _diagnosis(self) -> str:
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = self.stderr_path.read_text("utf-8", "replace")[-3000:]
        return f"worker {self.name} (pid {self.pid}) events={self.events} stderr={stderr}"

    def wait_for(self, name: str, timeout: float = WAIT) -> dict[str, Any]:
        """Block until the worker prints event ``name``; fail on exit or timeout."""
        for event in self.events:
            if event["event"] == name:
                return event
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {name!r}: {self._diagnosis()}")
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if item is None:
                self._queue.put(None)  # stay at EOF for later waits
                raise AssertionError(f"exited before {name!r}: {self._diagnosis()}")
            self.events.append(item)
            if item["event"] == name:
                return item

    def finish(self, timeout: float = WAIT) -> int:
        """Wait for the process to exit and for all its output; return its exit code."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not exit: {self._diagnosis()}") from None
        self._reader.join(timeout=5)
        self._drain()
        return code

    def _drain(self) -> None:
        """Move every event already read from stdout into ``events``."""
        while True:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                break
            if event is None:
                self._queue.put(None)
                break
            self.events.append(event)

    def kill(self) -> int:
        """SIGKILL: no cleanup, no report, exactly like a crashed machine."""
        os.kill(self.pid, signal.SIGKILL)
        return self.finish(timeout=10)

    def event_names(self) -> list[str]:
        """Names of the events printed so far (including any not yet waited for)."""
        self._drain()
        return [event["event"] for event in self.events]

    @property
    def answer(self) -> dict[str, Any]:
        return self.wait_for("answer")

    def assert_clean_exit(self) -> None:
        code = self.finish()
        assert code == 0, f"exit code {code}: {self._diagnosis()}"


class Procs:
    """Starts worker processes; whatever is still running at teardown is killed and reaped."""

    def __init__(self, settle: Settle, directory: Path) -> None:
        self.settle = settle
        self.directory = directory
        self.workers: list[Worker] = []
        self._count = 0

    def start(
        self,
        *,
        key: str,
        mode: str = "resume",
        provider: ProviderHandle | None = None,
        params: dict[str, Any] = PARAMS,
        name: str = "",
        extra: list[str] | None = None,
    ) -> Worker:
        self._count += 1
        name = name or f"w{self._count}"
        command = [
            sys.executable,
            str(WORKER_SCRIPT),
            "--url",
            self.settle.base_url,
            "--key",
            key,
            "--worker",
            name,
            "--mode",
            mode,
            "--params",
            json.dumps(params),
            "--digest",
            digest_of(params),
            *(provider.worker_args() if provider else []),
            *(extra or []),
        ]
        return self.spawn(command, name)

    def spawn(self, command: list[str], name: str) -> Worker:
        """Start ``command`` (a script printing JSON lines) as worker ``name``."""
        env = {
            **os.environ,
            "SETTLE_HOST_TOKEN": self.settle.host_token,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
        }
        stderr_path = self.directory / f"{name}.stderr"
        with open(stderr_path, "wb") as stderr:
            popen = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        worker = Worker(popen, name, stderr_path)
        self.workers.append(worker)
        return worker

    def go_file(self) -> Path:
        return self.directory / f"go-{self._count}-{time.monotonic_ns()}"

    def release(self, workers: list[Worker], go_file: Path, timeout: float = 60.0) -> None:
        """Barrier: wait until every worker printed ``ready``, then let them all go."""
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.wait_for("ready", timeout=max(0.1, deadline - time.monotonic()))
        go_file.touch()

    def cleanup(self) -> None:
        for worker in self.workers:
            if worker.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.popen.wait(timeout=10)
            if worker.popen.stdout is not None:
                with contextlib.suppress(OSError):
                    worker.popen.stdout.close()


# -- shared checks ------------------------------------------------------------------------


def wait_lease_lapsed(key: str, margin: float = 0.15, timeout: float = 10.0) -> None:
    """Sleep (real time) until the dispatch's lease has lapsed by the database's clock."""
    expires = Dispatch.objects.get(operation__key=key).lease_expires_at
    deadline = time.monotonic() + timeout
    while True:
        remaining = (expires - db_now()).total_seconds() + margin
        if remaining <= 0:
            return
        assert time.monotonic() < deadline, "the lease did not lapse in time"
        time.sleep(min(remaining, 0.5))


def permit_of(key: str) -> Permit:
    return Permit.objects.get(operation_key=key)


def permit_events(key: str, kind: str, reason: str | None = None) -> int:
    """Events of ``kind`` (and ``reason``) in the history of the operation's permit: a
    summary line counts the refusals it counts."""
    permit = Permit.objects.select_related("approval").get(operation_key=key)
    return sum(
        line["detail"].get("count", 1) if line["kind"] == "refused" else 1
        for line in permit_history(permit)
        if line["kind"] == kind and (reason is None or line["reason"] == reason)
    )


def operation(key: str) -> Operation:
    return Operation.objects.get(key=key)


def last_verdict(key: str) -> str:
    evidence = Evidence.objects.filter(operation__key=key).last()
    assert evidence is not None, f"no evidence for {key}"
    return str(evidence.verdict)


def assert_audit_intact() -> None:
    breaks = list(audit_verify())
    assert breaks == [], breaks


# -- after a crash ------------------------------------------------------------------------


def crash(procs: Procs, key: str, provider: ProviderHandle, point: str, *extra: str) -> Worker:
    """A worker resumes, wins the dispatch, gets to ``point`` and is SIGKILLed there."""
    worker = procs.start(
        key=key, provider=provider, extra=["--crash-point", point, *extra], name="doomed"
    )
    answer = worker.answer
    assert answer["status"] == 200 and answer["body"]["decision"] == "dispatch", answer
    assert answer["body"]["fencing_token"]
    if point == "after_effect":
        worker.wait_for("effect_committed")
    worker.wait_for("holding")
    assert worker.kill() == -signal.SIGKILL
    assert "reported" not in worker.event_names()
    # The dead worker left a stranded receipt behind.
    assert operation(key).state == "dispatched"
    assert Dispatch.objects.get(operation__key=key).receipt_status == "running"
    return worker


def assert_one_dispatch_one_consumption(key: str) -> None:
    assert Dispatch.objects.filter(operation__key=key).count() == 1
    assert permit_of(key).status == "consumed"
    assert permit_events(key, "consumed") == 1
    assert AuditEvent.objects.filter(operation_key=key, kind="permit_consumed").count() == 1


def assert_recovered_receipt(key: str) -> None:
    dispatch = Dispatch.objects.select_related("receipt_evidence").get(operation__key=key)
    assert dispatch.receipt_status == "succeeded"
    assert dispatch.receipt_recovered is True
    evidence = dispatch.receipt_evidence
    assert evidence is not None
    assert evidence.operation.key == key
    assert evidence.verdict == Verdict.MATCH
    assert evidence.provider_status == "committed"
    assert evidence == Evidence.objects.filter(operation__key=key).last()
    op = operation(key)
    assert (op.state, op.recovered) == ("released", True)


# -- waiting on the background ------------------------------------------------------------


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.1) -> float:
    """Poll until ``predicate()``; return the seconds it took, fail after ``timeout``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)
    return time.monotonic() - started


def state_of(key: str) -> str:
    return str(Operation.objects.filter(key=key).values_list("state", flat=True).get())


def transitions_of(key: str, event: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(operation_key=key, kind="transition", data__event=event))


def assert_nobody_resumed(key: str) -> None:
    """Every change after the dispatch was the sweeper's: no host resumed or looked up."""
    transitions = AuditEvent.objects.filter(operation_key=key, kind="transition")
    later = [t for t in transitions if t.data["event"] not in ("approve", "dispatch")]
    assert later and {t.actor for t in later} == {SWEEPER_ACTOR}, later
    assert not LookupAttempt.objects.filter(operation__key=key).exclude(trigger="task").exists()
