"""The one transition table, and the compare-and-set that applies it.

No other code writes ``Operation.state``. A change that the table does not allow, or
whose (state, version) no longer holds, raises ``TransitionRefused`` and changes nothing.

A transition ``riding`` (PostgreSQL) is written by the statement of its transaction's
events, still a compare-and-set on the (state, version) its caller locked: for a
caller whose transaction neither reads nor writes the operation's row again (further
transitions of it join the same write).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from audit.chain import (
    HeadRide,
    audit_append,
    audit_head_fields,
    audit_head_saved,
    audit_retract,
    audit_retract_many,
    audit_transaction_head_ridden,
    audit_transaction_head_ride,
    audit_transaction_open,
)
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from dbsql.batches import values_update
from dbsql.cursor import vendor
from dbsql.writes import Rider, update, update_sql
from recovery.changes import OperationChange, changes_record
from recovery.models import Operation, State, receipt_running_sql


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
    # A verified completion after the host reported failure: while dispatched that report
    # fails the operation; after the lease lapsed it is kept on the receipt only.
    (State.FAILED, Event.CONFLICT): State.RECONCILE,
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
    riding: bool = False,
    **fields: Any,
) -> Operation:
    """Compare-and-set ``operation`` along ``event`` and audit it in the same transaction.

    ``fields`` are other columns written by the same UPDATE (``recovered`` and so on).
    The in-memory ``operation`` is updated to match the row, and the change handed to
    its recorders (``recovery.changes``) in the same transaction. A batch of one
    (``operation_transition_many``) whose refusal is raised. ``riding``: written by the
    events' statement (the module's docstring says for whom).
    """
    ridden = audit_transaction_head_ridden(operation.key)
    if (riding or ridden) and vendor() == "postgresql" and audit_transaction_open():
        _ride(Change(operation, event, data, fields), actor, ridden)
        return operation
    refused = operation_transition_many(
        changes=[Change(operation, event, data, fields)], actor=actor
    )
    if refused:
        raise refused[0]
    return operation


@dataclass(frozen=True)
class Change:
    """One operation's transition in a batch: ``operation_transition``'s arguments."""

    operation: Operation
    event: str
    data: dict[str, Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def operation_transition_many(*, changes: list[Change], actor: Actor) -> list[TransitionRefused]:
    """``operation_transition`` for a batch; the refusals, each on its own.

    The same table decides each target and the same event is audited; each row is still
    a compare-and-set on its own (state, version), all of them in one statement per
    set of ``fields`` names on PostgreSQL (``values_update``), one by one elsewhere.
    A refused change writes nothing and takes back its event; the others go ahead.
    Every operation at most once, each locked by the caller.
    """
    assert len({change.operation.pk for change in changes}) == len(changes), "once each"
    refused: list[TransitionRefused] = []
    if vendor() != "postgresql":
        for change in changes:
            try:
                _transition_row(change, actor)
            except TransitionRefused as exc:
                refused.append(exc)
        return refused
    by_fields: dict[tuple[str, ...], list[tuple[Change, str, AuditEvent]]] = {}
    for change in changes:
        ridden = audit_transaction_head_ridden(change.operation.key)
        if ridden is not None:
            try:
                _ride(change, actor, ridden)  # joins the transitions that ride already
            except TransitionRefused as exc:
                refused.append(exc)
            continue
        try:
            target = _target(change)
        except TransitionRefused as exc:
            refused.append(exc)
            continue
        audited = _audited(change, target, actor)
        by_fields.setdefault(tuple(sorted(change.fields)), []).append((change, target, audited))
    retracted = []
    recorded: list[OperationChange] = []
    now = timezone.now()
    for names, group in by_fields.items():
        changed = values_update(
            Operation,
            values=[
                ("id", "id"),
                ("state", "state"),
                ("version", "version"),
                ("target", "state"),
                ("audit_seq", "audit_seq"),
                ("audit_hash", "audit_hash"),
                ("updated_at", "updated_at"),
                *((name, name) for name in names),
            ],
            rows=[
                (
                    change.operation.pk,
                    change.operation.state,
                    change.operation.version,
                    target,
                    audited.seq,
                    audited.hash,
                    now,
                    *(change.fields[name] for name in names),
                )
                for change, target, audited in group
            ],
            assign={
                "state": "v.target",
                "version": "t.version + 1",
                "updated_at": "v.updated_at",
                "audit_seq": "v.audit_seq",
                "audit_hash": "v.audit_hash",
                **_receipt_running_found(names, "t"),
                **{name: f"v.{name}" for name in names},
            },
            expect={"state": "state", "version": "version"},
        )
        for change, target, audited in group:
            if change.operation.pk in changed:
                _moved(change, target, {"audit_seq": audited.seq, "audit_hash": audited.hash})
                recorded.append(_recorded(change, target))
            else:
                retracted.append(audited)
                refused.append(
                    TransitionRefused(change.operation, change.event, "stale (state, version)")
                )
    audit_retract_many(retracted)
    changes_record(recorded)
    return refused


def _transition_row(change: Change, actor: Actor) -> None:
    """One change in a statement of its own, where one per batch is not to be had."""
    operation = change.operation
    target = _target(change)
    # Appended first, so that the chain's new head is written by the same UPDATE.
    audited = _audited(change, target, actor)
    head = audit_head_fields(operation)
    changed = update(
        Operation,
        where={"pk": operation.pk, "state": operation.state, "version": operation.version},
        values={"state": target, "updated_at": timezone.now(), **head, **change.fields},
        expressions={
            "version": '"version" + 1',
            **_receipt_running_found(change.fields, Operation._meta.db_table),
        },
    )
    if changed != 1:
        audit_retract(audited)
        raise TransitionRefused(operation, change.event, "stale (state, version)")
    _moved(change, target, head)
    changes_record([_recorded(change, target)])


def _receipt_running_found(fields: Iterable[str], row: str) -> dict[str, str]:
    """``Operation.receipt_running`` as the UPDATE of ``row`` (an alias) finds it, unless
    the change sets it among ``fields`` (a write to the receipt earlier in this
    transaction, or one riding with it, included)."""
    if "receipt_running" in fields:
        return {}
    return {"receipt_running": receipt_running_sql(row, value=True)}


def _recorded(change: Change, target: str) -> OperationChange:
    """A change that moved to ``target``, for the recorders of changes."""
    return OperationChange(change.operation, change.event, target, change.data or {})


def _target(change: Change) -> str:
    """The state the table allows ``change`` to reach, or ``TransitionRefused``."""
    target = next_state(change.operation.state, change.event)
    if target is None:
        raise TransitionRefused(change.operation, change.event, "not allowed from this state")
    return target


def _audited(change: Change, target: str, actor: Actor) -> AuditEvent:
    operation = change.operation
    return audit_append(
        kind=AuditKind.TRANSITION,
        operation=operation,
        actor=actor,
        data={
            "event": change.event,
            "from": operation.state,
            "to": target,
            "version": operation.version + 1,
            **(change.data or {}),
        },
    )


def _moved(change: Change, target: str, head: dict[str, Any]) -> None:
    """The row changed: the in-memory operation follows it, the chain's head is saved."""
    operation = change.operation
    audit_head_saved(operation, head)
    operation.state = target
    operation.version += 1
    for name, value in change.fields.items():
        setattr(operation, name, value)


@dataclass(frozen=True)
class _Riding:
    """One operation's transitions written by the events' statement: from the (state,
    version) its caller locked to ``target``, ``steps`` versions on."""

    pk: int
    key: str
    state: str
    version: int
    target: str = ""
    steps: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None


def _ride(change: Change, actor: Actor, ridden: HeadRide | None) -> None:
    """``_transition_row``, its UPDATE written by the events' statement, with the chain's
    head as it stands then; a second transition of the row joins the first's write
    (``ridden``)."""
    operation = change.operation
    target = _target(change)
    _audited(change, target, actor)
    before = (
        ridden.state
        if ridden is not None
        else _Riding(operation.pk, operation.key, operation.state, operation.version)
    )
    riding = replace(
        before,
        target=target,
        steps=before.steps + 1,
        fields={**before.fields, **change.fields},
        updated_at=timezone.now(),
    )
    audit_transaction_head_ride(operation.key, HeadRide(riding, _ride_sql, _ride_counted))
    _moved(change, target, {})
    changes_record([_recorded(change, target)])


def _ride_sql(riding: _Riding, head: tuple[int, str]) -> Rider:
    return update_sql(
        Operation,
        where={"pk": riding.pk, "state": riding.state, "version": riding.version},
        values={
            "state": riding.target,
            "updated_at": riding.updated_at,
            "audit_seq": head[0],
            "audit_hash": head[1],
            **riding.fields,
        },
        expressions={
            "version": f'"version" + {riding.steps}',
            **_receipt_running_found(riding.fields, Operation._meta.db_table),
        },
    )


def _ride_counted(riding: _Riding, count: int) -> None:
    if count != 1:  # its caller holds the row's lock: the row moved under it
        raise RuntimeError(f"{riding.key} was not at {riding.state} v{riding.version} any more")
