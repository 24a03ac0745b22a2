"""The one transition table, and the compare-and-set that applies it.

No other code writes ``Operation.state``. A change that the table does not allow, or
whose (state, version) no longer holds, raises ``TransitionRefused`` and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.utils import timezone

from approvals.actors import Actor
from recovery.audit import audit_append, audit_head_fields, audit_head_saved, audit_retract
from recovery.models import Operation, State


class Event:
    APPROVE = "approve"
    DENY = "deny"
    EXPIRE = "expire"
    REVOKE = "revoke"
    DISPATCH = "dispatch"
    COMMIT = "commit"
    FAIL = "fail"
    LEASE_LOST = "lease_lost"
    EVIDENCE_MATCH = "evidence_match"
    EVIDENCE_NOT_PERFORMED = "evidence_not_performed"
    ESCALATE = "escalate"
    CONFLICT = "conflict"
    CONFIRM = "confirm"
    VOID = "void"


TRANSITIONS: dict[tuple[str, str], str] = {
    (State.AWAITING_APPROVAL, Event.APPROVE): State.APPROVED,
    (State.AWAITING_APPROVAL, Event.DENY): State.DENIED,
    (State.AWAITING_APPROVAL, Event.EXPIRE): State.EXPIRED,
    (State.APPROVED, Event.EXPIRE): State.EXPIRED,
    (State.APPROVED, Event.REVOKE): State.REVOKED,
    (State.APPROVED, Event.DISPATCH): State.DISPATCHED,
    # The worker's own report, while it still holds the dispatch.
    (State.DISPATCHED, Event.COMMIT): State.RELEASED,
    (State.DISPATCHED, Event.FAIL): State.FAILED,
    (State.DISPATCHED, Event.LEASE_LOST): State.UNKNOWN,
    # Verified provider evidence (a lookup or a signed callback).
    (State.DISPATCHED, Event.EVIDENCE_MATCH): State.RELEASED,
    (State.DISPATCHED, Event.EVIDENCE_NOT_PERFORMED): State.FAILED,
    (State.UNKNOWN, Event.EVIDENCE_MATCH): State.RELEASED,
    (State.UNKNOWN, Event.EVIDENCE_NOT_PERFORMED): State.FAILED,
    (State.RECONCILE, Event.EVIDENCE_MATCH): State.RELEASED,
    (State.RECONCILE, Event.EVIDENCE_NOT_PERFORMED): State.FAILED,
    (State.DISPATCHED, Event.ESCALATE): State.RECONCILE,
    (State.UNKNOWN, Event.ESCALATE): State.RECONCILE,
    # A verified completion after the host reported failure.
    (State.FAILED, Event.CONFLICT): State.RECONCILE,
    (State.DISPATCHED, Event.CONFLICT): State.RECONCILE,
    (State.UNKNOWN, Event.CONFLICT): State.RECONCILE,
    # Operator decisions (``recovery.services.reconcile``): backed by the latest
    # evidence, or approved by a second operator.
    (State.UNKNOWN, Event.CONFIRM): State.RELEASED,
    (State.UNKNOWN, Event.VOID): State.VOIDED,
    (State.RECONCILE, Event.CONFIRM): State.RELEASED,
    (State.RECONCILE, Event.VOID): State.VOIDED,
}


class TransitionRefused(Exception):
    """The table forbids the change, or the operation moved on since it was read."""

    def __init__(self, operation: Operation, event: str, reason: str) -> None:
        super().__init__(f"{event} refused for {operation.key} in {operation.state}: {reason}")
        self.operation_key = operation.key
        self.state = operation.state
        self.version = operation.version
        self.event = event
        self.reason = reason


def next_state(state: str, event: str) -> str | None:
    return TRANSITIONS.get((state, event))


def operation_transition(
    *,
    operation: Operation,
    event: str,
    actor: Actor,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Operation:
    """Compare-and-set ``operation`` along ``event`` and audit it in the same transaction.

    ``fields`` are other columns written by the same UPDATE (``recovered`` and so on).
    The in-memory ``operation`` is updated to match the row.
    """
    target = next_state(operation.state, event)
    if target is None:
        raise TransitionRefused(operation, event, "not allowed from this state")
    # Appended first, so that the chain's new head is written by the same UPDATE.
    audited = audit_append(
        kind="transition",
        operation=operation,
        actor=actor,
        data={
            "event": event,
            "from": operation.state,
            "to": target,
            "version": operation.version + 1,
            **(data or {}),
        },
    )
    head = audit_head_fields(operation)
    changed = Operation.objects.filter(
        pk=operation.pk, state=operation.state, version=operation.version
    ).update(state=target, version=F("version") + 1, updated_at=timezone.now(), **head, **fields)
    if changed != 1:
        audit_retract(audited)
        raise TransitionRefused(operation, event, "stale (state, version)")
    audit_head_saved(operation, head)
    operation.state = target
    operation.version += 1
    for name, value in fields.items():
        setattr(operation, name, value)
    return operation
