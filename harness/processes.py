"""Processes the tests and benchmarks start: stopping one, and a child's side of the handshake.

A child (a worker, a fleet client) prints JSON lines (``emit``) and waits for a go file
(``wait_for_file``) so that its parent can release many at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any


def process_stop(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM, then SIGKILL to its whole group if it is not gone in ``timeout``; reaped.

    Until it is reaped its group id is still its own, so the kill reaches it and its
    children (gunicorn's workers) and nothing else; a process started in its parent's
    group (no ``start_new_session``) has no group of its own and is killed alone.
    Returns the exit code.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
    return process.returncode


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def wait_for_file(path: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            emit("timeout", waiting_for=what)
            sys.exit(3)
        time.sleep(0.002)
