"""Stopping a server process the tests started in a session (process group) of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def process_stop(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM, then SIGKILL to its whole group if it is not gone in ``timeout``; reaped.

    Until it is reaped its group id is still its own, so the kill reaches it and its
    children (gunicorn's workers) and nothing else. Returns the exit code.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
    return process.returncode
