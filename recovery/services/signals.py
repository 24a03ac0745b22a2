"""Signals that arrived too late or out of turn: recorded, never applied."""

from __future__ import annotations

from typing import Any

from recovery.audit import (
    audit_append,
    audit_chain_locked,
    audit_transaction,
)
from recovery.models import (
    Operation,
)
from recovery.services.locking import operations_locked
from recovery.transitions import TransitionRefused


def stale_signal(*, operation: Operation, signal: str, actor: str, data: dict[str, Any]) -> None:
    """Record something that arrived too late or out of turn; it changes nothing else."""
    audit_append(
        kind="stale_signal",
        operation=operation,
        actor=actor,
        data={"signal": signal, "state": operation.state, "version": operation.version, **data},
    )


def transition_refused_record(exc: TransitionRefused, actor: str) -> None:
    """Record a refused transition in a transaction of its own (the change rolled back)."""
    with audit_transaction():
        operation = operations_locked().filter(key=exc.operation_key).first()
        if operation is not None:
            audit_chain_locked(operation)
        audit_append(
            kind="stale_signal",
            operation=operation,
            actor=actor,
            data={
                "signal": "transition_refused",
                "event": exc.event,
                "reason": exc.reason,
                "state": exc.state,
                "version": exc.version,
            },
        )
