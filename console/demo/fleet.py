"""The demo's fleet and the processes it runs: worker processes, gunicorn, Celery.

Every child runs in a session of its own, so that stopping one reaches its own children
too (gunicorn's workers, Celery's pool) and a Ctrl-C in the terminal reaches only the
demo, which then stops them in order: SIGTERM to the group, a bounded wait, SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

BASE_DIR = Path(settings.BASE_DIR)
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Scenario:
    name: str  # the end of the operation key
    # The provider's name: demo-orders (SQLite), demo-journal (JSONL) or demo-payments
    # (HTTP, down: nothing listens where it is configured).
    provider: str
    scenario: str  # see console.demo.worker
    resume: bool = False  # a replacement worker resumes it once the lease has lapsed


# What each batch runs, and what the console shows for it afterwards.
FLEET = (
    Scenario("order-paid", "demo-orders", "normal"),  # released
    Scenario("ledger-posted", "demo-journal", "normal"),  # released
    Scenario("order-died-after-commit", "demo-orders", "after_commit", resume=True),  # released
    Scenario("order-died-before-commit", "demo-orders", "before_commit", resume=True),  # unknown
    Scenario("order-other-params", "demo-orders", "other_params", resume=True),  # reconcile
    Scenario("ledger-corrupt-line", "demo-journal", "corrupt", resume=True),  # reconcile
    Scenario("order-provider-down", "demo-orders", "provider_down"),  # failed
    Scenario("ledger-awaiting-approval", "demo-journal", "awaiting"),  # awaiting_approval
    # Killed before it reached the payment provider, which is down: every lookup finds it
    # unavailable; after the provider's lookup budget, reconcile.
    Scenario("payment-provider-down", "demo-payments", "before_commit", resume=True),
    # Killed after the commit and left to the sweeper: the background lookup releases it.
    Scenario("ledger-died-after-commit", "demo-journal", "after_commit"),
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the var dir the demo uses, made explicit."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "settle.settings",
        "SETTLE_VAR_DIR": str(settings.VAR_DIR),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


@dataclass
class Child:
    """A long-running child process (server, Celery) in a session of its own."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM to the group (graceful), then SIGKILL to it; reaped either way."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # Whatever the leader did, nothing of its group may outlive the demo.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return self.process.returncode


def start_child(name: str, command: list[str], log_path: Path) -> Child:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    return Child(name, process, log_path)


def healthy(url: str) -> bool:
    try:
        with _LOCAL.open(url + "/healthz", timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def web_start(*, host: str, port: int, workers: int, log_path: Path) -> tuple[Child, str]:
    """gunicorn serving the console and the API; waits (bounded) for ``/healthz``."""
    url = f"http://{host}:{port}"
    command = [_bin("gunicorn"), "-c", "python:settle.gunicorn_conf", "settle.wsgi"]
    command += ["-w", str(workers), "-b", f"{host}:{port}"]
    child = start_child("web", command, log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.alive():
        if healthy(url):
            return child, url
        time.sleep(0.1)
    child.stop()
    tail = log_path.read_text("utf-8", "replace")[-2000:]
    raise RuntimeError(f"the web server did not start on {url}; log tail:\n{tail}")


def celery_start(role: str, log_path: Path) -> Child:
    """``celery -A settle worker`` (the default queue: sweep, lookups), its ``webhooks``
    twin (``-Q`` the webhook queue, as production runs one) or ``celery -A settle beat``,
    on the configured broker."""
    if role == "webhooks":
        command = [_bin("celery"), "-A", "settle", "worker", "-l", "info", "-c", "1"]
        command += ["-Q", settings.SETTLE_WEBHOOK_QUEUE, "-n", "webhooks@%h"]
        return start_child(role, command, log_path)
    command = [_bin("celery"), "-A", "settle", role, "-l", "info"]
    if role == "worker":
        command += ["-c", "2"]
    return start_child(role, command, log_path)


# -- the fleet ----------------------------------------------------------------------------


@dataclass
class Worker:
    key: str
    process: subprocess.Popen[bytes]
    events: list[dict[str, Any]] = field(default_factory=list)

    def wait_settled(self, timeout: float) -> str:
        """Read events until the worker holds its dispatch or exits; the last event.

        Reads the pipe with ``os.read``: a buffered reader could hold ``holding`` in its
        buffer while ``select`` waits for more bytes that never come.
        """
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        pending = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.process.wait(timeout=10)
                    return str(self.events[-1]["event"]) if self.events else "exit"
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        self.events.append(json.loads(line))
                if self.events and self.events[-1]["event"] == "holding":
                    return "holding"
        self.kill()
        raise RuntimeError(f"demo worker for {self.key} did not get anywhere: {self.events}")

    def kill(self) -> int:
        self.process.kill()
        code = self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def worker_start(
    *, url: str, key: str, scenario: str, worker: str, tokens: Mapping[str, str], **extra: str
) -> Worker:
    command = [
        sys.executable,
        "-m",
        "console.demo.worker",
        "--url",
        url,
        "--key",
        key,
        "--scenario",
        scenario,
        "--worker",
        worker,
    ]
    for name, value in extra.items():
        command += [f"--{name.replace('_', '-')}", value]
    process = subprocess.Popen(
        command,
        cwd=BASE_DIR,
        env=child_env(tokens),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    return Worker(key, process)


@dataclass
class FleetReport:
    finished: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    resumed: dict[str, str] = field(default_factory=dict)  # key: the resume's decision


def fleet_run(
    *,
    url: str,
    batch: int,
    tokens: Mapping[str, str],
    providers: Mapping[str, tuple[str, str]],
    lease_seconds: int,
) -> FleetReport:
    """Run one batch: every scenario in its own process, all at once; kill the holders.

    ``providers``: name → (adapter, file path). After the kills, wait out the lease and
    let replacement workers resume the operations marked ``resume``. However it ends
    (Ctrl-C included), no worker process outlives it.
    """
    started: list[Worker] = []
    try:
        return _fleet_run(
            url=url,
            batch=batch,
            tokens=tokens,
            providers=providers,
            lease_seconds=lease_seconds,
            started=started,
        )
    finally:
        for worker in started:
            if worker.process.poll() is None:
                worker.kill()


def _fleet_run(
    *,
    url: str,
    batch: int,
    tokens: Mapping[str, str],
    providers: Mapping[str, tuple[str, str]],
    lease_seconds: int,
    started: list[Worker],
) -> FleetReport:
    report = FleetReport()
    workers = started
    # What each key's worker was started with: its replacement runs the same call.
    launched: dict[str, dict[str, str]] = {}
    for number, scenario in enumerate(FLEET):
        key = f"demo-b{batch}-{scenario.name}"
        adapter, path = providers[scenario.provider]
        params = {"amount": 1000 + 25 * number, "currency": "EUR", "batch": batch}
        action = {"sqlite": "order.place", "journal": "ledger.post"}.get(adapter, "payment.send")
        launched[key] = {
            "action": action,
            "provider": scenario.provider,
            "adapter": adapter,
            "provider_path": path,
            "params": json.dumps(params),
        }
        workers.append(
            worker_start(
                url=url,
                key=key,
                scenario=scenario.scenario,
                worker=f"demo-worker-{number}",
                tokens=tokens,
                **launched[key],
            )
        )
    for worker in workers:
        outcome = worker.wait_settled(timeout=60)
        if outcome == "holding":
            if worker.kill() != -signal.SIGKILL:
                raise RuntimeError(f"demo worker for {worker.key} was not killed: {worker.events}")
            report.killed.append(worker.key)
        elif outcome == "done":
            report.finished.append(worker.key)
        else:
            raise RuntimeError(f"demo worker for {worker.key} failed: {worker.events}")
    # The dead workers stop heartbeating; once their lease has lapsed, a replacement
    # worker may ask what became of the operation.
    time.sleep(lease_seconds + 1.0)
    replacements = [
        worker_start(
            url=url,
            key=f"demo-b{batch}-{scenario.name}",
            scenario="resume",
            worker="demo-replacement",
            tokens=tokens,
            **launched[f"demo-b{batch}-{scenario.name}"],
        )
        for scenario in FLEET
        if scenario.resume
    ]
    started.extend(replacements)
    for worker in replacements:
        if worker.wait_settled(timeout=60) != "done":
            raise RuntimeError(f"replacement worker for {worker.key} failed: {worker.events}")
        answers = [e for e in worker.events if e["event"] == "answer"]
        report.resumed[worker.key] = str(answers[-1]["body"].get("decision", "?"))
    return report
