"""Signals that arrived too late or out of turn: recorded, never applied."""

from __future__ import annotations

from typing import Any

from audit.chain import audit_append
from audit.kinds import AuditKind
from common.actors import Actor
from recovery.models import Operation
from recovery.vocabulary import StaleSignal


def stale_signal(
    *, operation: Operation, signal: StaleSignal, actor: Actor, data: dict[str, Any]
) -> None:
    """Record something that arrived too late or out of turn; it changes nothing else."""
    audit_append(
        kind=AuditKind.STALE_SIGNAL,
        operation=operation,
        actor=actor,
        data={"signal": signal, "state": operation.state, "version": operation.version, **data},
    )
