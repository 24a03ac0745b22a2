"""What ``Host`` and ``AsyncHost`` share: the worker's default name, the params' digest,
and the bounds each run is built with.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Generator
from typing import Any

from settle_client import errors
from settle_client._protocol import Outcome, Run, Step
from settle_client.canonical import CanonicalError, params_digest

Lifecycle = Generator[Step, Any, Outcome]
# Heartbeats while the lease's length is not known yet, or after one failed to arrive.
RETRY_HEARTBEAT_SECONDS = 0.5
# The longest the client asks a read to be held for an approval's decision (the server
# holds at most 25 s: recovery.contract.OPERATION_WAIT_MAX).
WAIT_SECONDS = 20


def default_worker() -> str:
    """``<hostname>-<pid>``, spelled as Settle accepts a worker's name."""
    name = re.sub(r"[^A-Za-z0-9._:@~-]", "-", f"{socket.gethostname()}-{os.getpid()}")
    return ("w" + name if not name[:1].isalnum() else name)[:200]


def _digest(params: dict[str, Any]) -> str:
    try:
        return params_digest(params)
    except CanonicalError as exc:
        cls = errors.ParamsTooLarge if exc.reason == "params_too_large" else errors.InvalidParams
        raise cls(str(exc), code=cls.code, reason=exc.reason) from None


def _reference(value: Any) -> str | None:
    return None if value is None else str(value)


class _Options:
    """What ``Host`` and ``AsyncHost`` share: their bounds, and building a ``Run``."""

    def __init__(
        self,
        *,
        worker: str | None,
        timeout: float,
        approval_timeout: float,
        settle_timeout: float,
        poll_interval: float,
        heartbeat_interval: float | None,
    ) -> None:
        self.worker = worker or default_worker()
        # How long a read may be held for an approval's decision: well inside the
        # request's timeout, at most the server's bound.
        self.wait = max(0, min(WAIT_SECONDS, int(timeout) - 5))
        self.approval_timeout = approval_timeout
        self.settle_timeout = settle_timeout
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval

    def spec(
        self,
        key: str,
        action: str,
        provider: str,
        params: dict[str, Any],
        on_approval: Callable[[str], object] | None,
        party: dict[str, Any] | None = None,
    ) -> Run:
        return Run(
            key=key,
            action=action,
            provider=provider,
            params=params,
            digest=_digest(params),
            worker=self.worker,
            approval_timeout=self.approval_timeout,
            party=party,
            settle_timeout=self.settle_timeout,
            poll_interval=self.poll_interval,
            wait=self.wait,
            on_approval=on_approval,
        )

    def beat_after(self, lease: float) -> float:
        """Seconds to the next heartbeat, a third of the lease left (or as configured)."""
        if self.heartbeat_interval is not None:
            return self.heartbeat_interval
        return max(0.05, lease / 3) if lease > 0 else RETRY_HEARTBEAT_SECONDS
