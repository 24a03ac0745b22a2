"""The one dispatch, its lease (heartbeats) and the worker's own report."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.utils import timezone

from approvals.models import Approval, Permit
from approvals.services.errors import Refusal
from approvals.services.permits import ConsumeResult, Recorded, permit_consume, permit_refusal
from audit.chain import audit_append, audit_transaction, audit_transaction_rider
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from common.actors import Actor
from common.canonical import canonical_params, params_digest
from common.errors import ErrorCode
from dbsql.rows import model_unsaved, select_first_at
from dbsql.writes import insert_sql, save_fields, save_fields_sql
from recovery.models import (
    Dispatch,
    Operation,
    State,
)
from recovery.services.errors import RecoveryError
from recovery.services.locking import OperationRef, binding, operation_lock
from recovery.services.refusals import RefusalsCommitted, refusals_recorded
from recovery.services.stale_signals import stale_signal
from recovery.transitions import Change, Event, operation_transition
from recovery.vocabulary import StaleSignal

T = TypeVar("T")


@dataclass(frozen=True)
class DispatchOutcome:
    """A dispatch made (``dispatch``: written with the transaction's events, so its
    database key is not known here) or refused (``refusal``), and the state it left."""

    refusal: str = ""
    dispatch: Dispatch | None = None
    state: str = ""


@refusals_recorded()
@audit_transaction()
def operation_dispatch(
    *, operation: Operation | OperationRef, worker: str, presented_digest: str, actor: Actor
) -> DispatchOutcome:
    """Consume the permit and create the one dispatch, atomically, or record the refusal."""
    return dispatch_locked(
        operation_lock(operation), worker=worker, presented_digest=presented_digest, actor=actor
    )


@dataclass
class DispatchAsked:
    """A dispatch asked for with an approval's opening (``permits.approval_open``'s
    ``then``): made in the opening's transaction, where a policy approved it.

    The operation is locked and its permit just issued: ``dispatch_locked`` consumes it
    as ``operation_dispatch`` would, saving the transaction and the lock of a call of its
    own. ``outcome`` stays None where the opening was not approved (a person decides it,
    or the policy denied it). Called again where the opening's transaction runs again
    (``policies.budgets_paid_last``), it answers for that run alone.
    """

    worker: str
    presented_digest: str
    actor: Actor
    outcome: DispatchOutcome | None = None

    def __call__(self, operation: Operation, approval: Approval, issued: Permit | None) -> None:
        self.outcome = None
        if approval.status == Approval.Status.APPROVED:
            self.outcome = dispatch_locked(
                operation,
                worker=self.worker,
                presented_digest=self.presented_digest,
                actor=self.actor,
                issued=issued,
            )


def dispatch_locked(
    operation: Operation,
    *,
    worker: str,
    presented_digest: str,
    actor: Actor,
    issued: Permit | None = None,
) -> DispatchOutcome:
    """``operation_dispatch`` for a caller that holds the operation's lock (resume);
    ``issued``: the permit its transaction issued, not written yet (``permit_consume``)."""
    bound = binding(operation)
    if operation.state == State.APPROVED:
        result = permit_consume(
            binding=bound, presented_digest=presented_digest, actor=actor, issued=issued
        )
    else:
        # Only an approved operation's permit can still be consumed; for any other, skip
        # the attempt and go straight to recording why not.
        result = permit_refusal(binding=bound, presented_digest=presented_digest, actor=actor)
    permit = result.permit
    permit_id = str(permit.id) if permit else ""
    if not result.consumed:
        if result.refusal == Refusal.EXPIRED and operation.state == State.APPROVED:
            operation_transition(operation=operation, event=Event.EXPIRE, actor=actor)
        refusal_audit(operation=operation, result=result, worker=worker, actor=actor)
        return DispatchOutcome(refusal=result.refusal, state=operation.state)
    assert permit is not None and permit.consumed_at is not None
    now = permit.consumed_at  # the database's clock, read by the consumption itself
    dispatch = model_unsaved(
        Dispatch,
        operation=operation,
        permit_id=permit.id,
        fencing_token=secrets.token_urlsafe(24),
        worker=worker,
        created_at=now,
        lease_expires_at=now + timedelta(seconds=operation.provider.lease_seconds),
    )
    # Written by the events' statement (``audit_transaction_rider``): nothing reads the
    # row before the commit (the transition is told that its receipt runs), and nothing
    # here needs the key the database gives it. Its unique operation and permit still
    # refuse a second dispatch, rolling back the whole transaction with it.
    audit_transaction_rider(insert_sql([dispatch]))
    audit_append(
        kind=AuditKind.PERMIT_CONSUMED,
        operation=operation,
        actor=actor,
        data={"permit_id": permit_id, "worker": worker},
    )
    operation_transition(
        operation=operation,
        event=Event.DISPATCH,
        actor=actor,
        data={"worker": worker},
        riding=True,  # as the dispatch's row: nothing reads the operation's after
        receipt_running=True,
    )
    return DispatchOutcome(dispatch=dispatch, state=operation.state)


def refusal_audit(
    *, operation: Operation, result: ConsumeResult, worker: str, actor: Actor
) -> None:
    """Put a consumption refusal on the audit chain as the permit's history recorded it.

    One event per refusal up to the window's limit, one when a window's summary opens,
    and one with the final count of an earlier window's summary that this refusal closed;
    a refusal counted in an open summary adds none.
    """
    permit_id = str(result.permit.id) if result.permit else ""
    if result.closed is not None:
        closed = result.closed
        refusal_append(
            kind=AuditKind.CONSUME_REFUSED,
            code=result.refusal,
            operation=operation,
            actor=actor,
            data={
                "permit_id": permit_id,
                "counted": closed["count"],
                "first_at": closed["first_at"],
                "last_at": closed["last_at"],
                "permit_event_id": closed["permit_event_id"],
            },
        )
    if result.recorded == Recorded.COUNTED:
        return
    data: dict[str, object] = {"permit_id": permit_id, "worker": worker}
    if result.recorded == Recorded.SUMMARY:
        assert result.window is not None
        data["summary_from"], data["summary_until"] = (t.isoformat() for t in result.window)
    refusal_append(
        kind=AuditKind.CONSUME_REFUSED,
        code=result.refusal,
        operation=operation,
        actor=actor,
        data=data,
    )


def _dispatch_for_token(
    operation: Operation, fencing_token: str, actor: Actor
) -> tuple[Dispatch, datetime]:
    """The dispatch ``fencing_token`` holds, and the database's clock (one statement)."""
    dispatch, now = select_first_at(Dispatch, operation=operation.pk)
    presented = fencing_token.encode("utf-8", "surrogatepass")
    if dispatch is None or not hmac.compare_digest(dispatch.fencing_token.encode(), presented):
        stale_signal(
            operation=operation,
            signal=StaleSignal.STALE_FENCING_TOKEN,
            actor=actor,
            data={"dispatched": dispatch is not None},
        )
        raise RecoveryError(
            ErrorCode.STALE_FENCING_TOKEN,
            "this fencing token does not hold the operation's dispatch",
        )
    return dispatch, now


def _holding_dispatch(
    operation: Operation | OperationRef,
    fencing_token: str,
    actor: Actor,
    then: Callable[[Operation, Dispatch, datetime], T],
) -> T:
    """Run ``then`` under the operation's lock on the dispatch ``fencing_token`` holds,
    with the database's clock as that dispatch was read.

    A refusal (a stale token, a lost lease) is recorded in the transaction and raised
    only after it commits, so that what was recorded stays on the record.
    """
    with RefusalsCommitted():
        locked = operation_lock(operation)
        return then(locked, *_dispatch_for_token(locked, fencing_token, actor))


@refusals_recorded()
def operation_heartbeat(
    *, operation: Operation | OperationRef, fencing_token: str, actor: Actor
) -> Dispatch:
    """Extend the lease of a live dispatch; a stale token changes nothing and is recorded.

    A lease that already lapsed is lost, whoever notices first: the heartbeat moves the
    operation to ``unknown`` itself, so a stalled worker learns it may not carry on.
    """

    def extend(operation: Operation, dispatch: Dispatch, now: datetime) -> Dispatch:
        if operation.state == State.DISPATCHED and not dispatch.lease_alive(now):
            lease_lapsed(operation, dispatch, actor)
        if operation.state != State.DISPATCHED:
            stale_signal(
                operation=operation, signal=StaleSignal.HEARTBEAT_AFTER_LEASE, actor=actor, data={}
            )
            raise RecoveryError(
                ErrorCode.LEASE_LOST,
                f"the operation is {operation.state}; the lease is gone",
                state=operation.state,
            )
        dispatch.last_heartbeat_at = now
        dispatch.lease_expires_at = now + timedelta(seconds=operation.provider.lease_seconds)
        save_fields(dispatch, ["last_heartbeat_at", "lease_expires_at"])
        return dispatch

    return _holding_dispatch(operation, fencing_token, actor, extend)


@dataclass(frozen=True)
class ReportOutcome:
    applied: bool
    state: str
    receipt_status: str


@refusals_recorded()
def operation_report(
    *,
    operation: Operation | OperationRef,
    fencing_token: str,
    outcome: str,
    provider_reference: str,
    actor: Actor,
    result: dict[str, Any] | None = None,
) -> ReportOutcome:
    """Record the worker's own result. The first report wins; later ones are signals.

    ``result`` (what the effect returned, checked by the caller) is kept with the first
    report, for a repeat of the call to answer; the audit line keeps its digest only."""
    return _holding_dispatch(
        operation,
        fencing_token,
        actor,
        lambda locked, dispatch, _: _report_apply(
            locked, dispatch, outcome, provider_reference, actor, result
        ),
    )


def _report_apply(
    operation: Operation,
    dispatch: Dispatch,
    outcome: str,
    reference: str,
    actor: Actor,
    result: dict[str, Any] | None = None,
) -> ReportOutcome:
    report: dict[str, Any] = {"outcome": outcome, "provider_reference": reference}
    if dispatch.receipt_status != Dispatch.ReceiptStatus.RUNNING:
        stale_signal(
            operation=operation,
            signal=StaleSignal.DUPLICATE_REPORT,
            actor=actor,
            data={**report, "receipt_status": dispatch.receipt_status},
        )
        return ReportOutcome(False, operation.state, dispatch.receipt_status)
    committed = outcome == "committed"
    dispatch.receipt_status = (
        Dispatch.ReceiptStatus.SUCCEEDED if committed else Dispatch.ReceiptStatus.FAILED
    )
    dispatch.receipt_reference = reference
    dispatch.receipt_reported_at = timezone.now()
    dispatch.receipt_result = result
    # Written by the events' statement (``audit_transaction_rider``): nothing reads the
    # receipt again before the commit; the operation's transition is told that this
    # change completes it (an operation has one dispatch) instead of reading it.
    receipt = ["receipt_status", "receipt_reference", "receipt_reported_at", "receipt_result"]
    audit_transaction_rider(save_fields_sql(dispatch, receipt))
    if result is not None:
        report["result_digest"] = params_digest(canonical_params(result))
    audit_append(kind=AuditKind.HOST_REPORT, operation=operation, actor=actor, data=report)
    if operation.state == State.DISPATCHED:
        operation_transition(
            operation=operation,
            event=Event.COMMIT if committed else Event.FAIL,
            actor=actor,
            riding=True,  # as the receipt: nothing reads the operation's row after
            receipt_running=False,
        )
    else:
        # The lease lapsed first: only provider evidence may settle it now.
        stale_signal(
            operation=operation,
            signal=StaleSignal.REPORT_AFTER_LEASE,
            actor=actor,
            data={**report, "state": operation.state},
        )
    return ReportOutcome(True, operation.state, dispatch.receipt_status)


def lease_lapsed(operation: Operation, dispatch: Dispatch, actor: Actor) -> None:
    """The worker went quiet past its lease: the outcome is unknown until evidence says."""
    change = lease_lapsed_change(operation, dispatch)
    operation_transition(
        operation=operation, event=change.event, actor=actor, data=change.data, **change.fields
    )


def lease_lapsed_change(operation: Operation, dispatch: Dispatch) -> Change:
    """``lease_lapsed``'s transition, for a batch of them (``operation_transition_many``)."""
    return Change(
        operation,
        Event.LEASE_LOST,
        {
            "reason": "no heartbeat or report before the lease expired",
            "lease_expires_at": dispatch.lease_expires_at.isoformat(),
            "last_heartbeat_at": (
                dispatch.last_heartbeat_at.isoformat() if dispatch.last_heartbeat_at else None
            ),
        },
        {"next_lookup_at": timezone.now()},
    )
