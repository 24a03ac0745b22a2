"""Real Celery processes for the background-recovery tests: workers, beat, a private Redis.

``celery -A settle worker`` and ``celery -A settle beat`` run as production runs them,
from the repository root, against the test database (``DATABASE_URL``) and the broker
the environment names (``CELERY_BROKER_URL``; CI: Redis). Given another install's
``celery`` and a ``cwd`` outside the checkout, they run that install's code instead (a
venv made with ``pip install .``). Each test gets a queue of its own
(``SETTLE_CELERY_QUEUE``), so parallel runs on one Redis database never take each
other's messages. Every process runs in a session of its own and is killed with its
children at the end; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.providers import _free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


def celery_executable() -> str:
    beside = Path(sys.executable).with_name("celery")
    if beside.exists():
        return str(beside)
    found = shutil.which("celery")
    if found is None:
        raise RuntimeError("celery is not installed")
    return found


def queue_name() -> str:
    return f"settle-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def webhook_queue(env: Mapping[str, str | None]) -> str:
    """The webhook queue processes given ``env`` use (the settings' rule, from outside)."""
    default = env.get("SETTLE_CELERY_QUEUE") or "settle"
    return env.get("SETTLE_WEBHOOK_QUEUE", f"{default}-webhooks") or default


@dataclass
class Proc:
    """One process (and its session), with its output in ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path
    name: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text("utf-8", "replace")
        return ""

    def wait_for_log(self, text: str, timeout: float = 60.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while self.log().count(text) < count:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited before {text!r}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {text!r} in time:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def children(self) -> list[int]:
        """Direct child processes (a prefork worker's pool processes)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a warm shutdown), then SIGKILL to the whole session; reaped."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # The session may still hold pool processes; none may outlive the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole session at once: a machine that died."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def child_environment(env: Mapping[str, str | None]) -> dict[str, str]:
    """This process's environment with Settle's settings, and ``env`` over it (None: removed)."""
    child_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settle.settings"}
    for key, value in env.items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    return child_env


def _start(
    command: list[str],
    *,
    name: str,
    log_path: Path,
    env: Mapping[str, str | None],
    cwd: Path = REPO_ROOT,
) -> Proc:
    child_env = child_environment(env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    return Proc(process, log_path, name)


def worker_start(
    *,
    log_path: Path,
    env: Mapping[str, str | None],
    concurrency: int = 1,
    name: str = "worker",
    celery: str | None = None,
    cwd: Path = REPO_ROOT,
    queues: str | None = None,
) -> Proc:
    """``celery -A settle worker`` (prefork); returns once it says it is ready.

    ``queues``: ``-Q`` (a webhook worker's queue); without, the default queue alone.
    """
    command = [
        celery or celery_executable(),
        "-A",
        "settle",
        "worker",
        "-l",
        "info",
        "-P",
        "prefork",
        "-c",
        str(concurrency),
        "-n",
        f"{name}-{uuid.uuid4().hex[:6]}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *(["-Q", queues] if queues else []),
    ]
    proc = _start(command, name=name, log_path=log_path, env=env, cwd=cwd)
    try:
        proc.wait_for_log(" ready.")
    except BaseException:
        proc.stop()
        raise
    return proc


def beat_start(
    *,
    directory: Path,
    env: Mapping[str, str | None],
    celery: str | None = None,
    cwd: Path = REPO_ROOT,
) -> Proc:
    """``celery -A settle beat`` with its schedule file in ``directory``."""
    command = [
        celery or celery_executable(),
        "-A",
        "settle",
        "beat",
        "-l",
        "info",
        "-s",
        str(directory / "celerybeat-schedule"),
        "--pidfile",
        str(directory / "celerybeat.pid"),
    ]
    proc = _start(command, name="beat", log_path=directory / "beat.log", env=env, cwd=cwd)
    try:
        proc.wait_for_log("beat: Starting")
    except BaseException:
        proc.stop()
        raise
    return proc


def redis_start(directory: Path, port: int = 0, extra: tuple[str, ...] = ()) -> tuple[Proc, int]:
    """A private ``redis-server`` (no persistence) on ``port`` (a free one if 0).

    ``extra``: more of its options (``--enable-debug-command yes`` for ``DEBUG SLEEP``).
    """
    port = port or _free_port()
    executable = shutil.which("redis-server")
    if executable is None:
        raise RuntimeError("redis-server is not installed")
    command = [
        executable,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(directory),
        *extra,
    ]
    proc = _start(command, name=f"redis:{port}", log_path=directory / f"redis-{port}.log", env={})
    try:
        proc.wait_for_log("Ready to accept connections", timeout=20)
    except BaseException:
        proc.stop()
        raise
    return proc, port
