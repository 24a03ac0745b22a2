"""The parent's side of a fleet: start the client processes, release them together, collect.

Used by ``bench/api.py`` (role ``lifecycle``), ``bench/client.py`` and
``tests/integration/test_fleet_soak.py`` (the mixed roles).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEET_SCRIPT = Path(__file__).with_name("process.py")


@dataclass
class FleetSpec:
    """One client to start: its name, role, providers (``--providers``) and more arguments."""

    name: str
    role: str
    providers: list[dict[str, Any]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


def fleet_run(
    *,
    url: str,
    host_token: str,
    approver_token: str,
    clients: list[FleetSpec],
    seconds: float,
    directory: Path,
    ready_timeout: float = 60.0,
    grace: float = 60.0,
    on_go: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Start every client, release them together, wait (bounded) and collect their results.

    ``on_go`` is called once every client is ready, just before they are released (a
    benchmark starts its meters there, after the clients' own start-up).

    Whatever happens, every process started here is killed (if still running) and reaped
    before this returns or raises. A client that wrote no result is returned as
    ``{"name", "role", "error", "exit_code"}`` with its stderr's tail.
    """
    directory.mkdir(parents=True, exist_ok=True)
    shared = directory / "shared"
    shared.mkdir(exist_ok=True)
    go_file = directory / "go"
    env = {
        **os.environ,
        "SETTLE_HOST_TOKEN": host_token,
        "SETTLE_APPROVER_TOKEN": approver_token,
        "PYTHONUNBUFFERED": "1",
    }
    started: list[tuple[FleetSpec, subprocess.Popen[bytes]]] = []
    try:
        for spec in clients:
            command = [
                sys.executable,
                str(FLEET_SCRIPT),
                "--url",
                url,
                "--name",
                spec.name,
                "--role",
                spec.role,
                "--seconds",
                str(seconds),
                "--go-file",
                str(go_file),
                "--out",
                str(directory / f"{spec.name}.json"),
                "--providers",
                json.dumps(spec.providers),
                "--shared-dir",
                str(shared),
                *spec.args,
            ]
            with (
                open(directory / f"{spec.name}.stdout", "wb") as stdout,
                open(directory / f"{spec.name}.stderr", "wb") as stderr,
            ):
                process = subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                )
            started.append((spec, process))
        _await_ready(directory, started, time.monotonic() + ready_timeout)
        if on_go is not None:
            on_go()
        go_file.touch()
        deadline = time.monotonic() + seconds + grace
        for spec, process in started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"fleet client {spec.name} did not finish in time") from None
    finally:
        for _, process in started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
    return [_result(directory, spec, process) for spec, process in started]


def _await_ready(
    directory: Path, started: list[tuple[FleetSpec, subprocess.Popen[bytes]]], deadline: float
) -> None:
    waiting = {spec.name: process for spec, process in started}
    while waiting:
        for name, process in list(waiting.items()):
            with contextlib.suppress(OSError):
                if '"event": "ready"' in (directory / f"{name}.stdout").read_text("utf-8"):
                    del waiting[name]
                    continue
            if process.poll() is not None:
                raise RuntimeError(
                    f"fleet client {name} exited before ready: {_tail(directory, name)}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet clients not ready in time: {sorted(waiting)}")
        time.sleep(0.02)


def _tail(directory: Path, name: str) -> str:
    with contextlib.suppress(OSError):
        return (directory / f"{name}.stderr").read_text("utf-8", "replace")[-2000:]
    return ""


def _result(directory: Path, spec: FleetSpec, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    path = directory / f"{spec.name}.json"
    try:
        result: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {
            "name": spec.name,
            "role": spec.role,
            "exit_code": process.returncode,
            "error": _tail(directory, spec.name) or "no result written",
        }
    return result
