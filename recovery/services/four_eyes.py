"""Four eyes: a second operator approves or rejects a proposed reconciliation.

A proposal (``recovery.services.reconcile``) is bound to the operation's version and
latest evidence as the proposer saw them: if either moved on, approving it invalidates
it instead. Approving and the change it approves are one transaction; the proposer
never approves their own. Every approval, rejection, invalidation and refusal is an
audit event on the operation's chain.
"""

from __future__ import annotations

from django.utils import timezone

from approvals.actors import Actor
from approvals.models import ReconciliationRequest
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.errors import ErrorCode
from recovery.models import Dispatch, Evidence, Operation
from recovery.permissions import ProviderPermission
from recovery.services.errors import RecoveryError
from recovery.services.locking import operation_lock
from recovery.services.operator import operator_permitted, operator_refusals
from recovery.services.reconcile import Decided, apply_decision, evidence_latest, reconcile_grounds
from recovery.services.stale_signals import refusals_recorded


def _request_locked(
    operation: Operation, request_id: int
) -> tuple[Operation, ReconciliationRequest]:
    """The operation, then its request (the lock order: operation, then approvals rows)."""
    locked = operation_lock(operation)
    request = ReconciliationRequest.objects.select_for_update().get(
        pk=request_id, operation_key=locked.key
    )
    return locked, request


def _request_closed(request: ReconciliationRequest, status: str, actor: Actor, reason: str) -> None:
    request.status = status
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason[:500]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])


def _changed_since(locked: Operation, request: ReconciliationRequest) -> str | None:
    """What moved on since the request was proposed, or None."""
    if locked.version != request.operation_version:
        return (
            f"the operation moved on: it is now {locked.state}, version {locked.version} "
            f"(proposed at version {request.operation_version})"
        )
    latest = evidence_latest(locked)
    if (latest.pk if latest is not None else None) != request.evidence_seen:
        verdict = latest.verdict if latest is not None else "none"
        return f"new evidence arrived since it was proposed (latest verdict: {verdict})"
    return None


def _still_holds(
    locked: Operation, request: ReconciliationRequest
) -> tuple[Evidence | None, str | None]:
    """The evidence backing the proposal now (if any), or what moved on since it was made."""
    changed = _changed_since(locked, request)
    if changed is not None:
        return None, changed
    try:
        backing = reconcile_grounds(
            operation=locked,
            action=request.action,
            evidence=evidence_latest(locked),
            dispatch=Dispatch.of(locked),
        )
    except RecoveryError as exc:
        return None, exc.message
    return backing, None


@refusals_recorded()
def reconciliation_approve(
    *, operation: Operation, request_id: int, reason: str, actor: Actor
) -> Decided:
    """Approve another operator's proposal and take the decision, in one transaction.

    Refused without ``approve_reconciliations``, for the proposer (``self_approval``)
    and for a request already decided; a request whose operation or evidence moved on
    since the proposal is invalidated (``request_invalidated``).
    """
    operator_permitted(
        operation=operation,
        action="approve",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with operator_refusals(operation, "approve", actor):
        locked, request = _request_locked(operation, request_id)
        if request.status != ReconciliationRequest.Status.PENDING:
            raise RecoveryError(
                ErrorCode.ALREADY_DECIDED, f"the request is already {request.status}"
            )
        if request.proposed_by == actor:
            raise RecoveryError(
                ErrorCode.SELF_APPROVAL, "a proposal needs a second operator: you proposed this one"
            )
        backing, changed = _still_holds(locked, request)
        if changed is not None:
            _request_closed(request, ReconciliationRequest.Status.INVALIDATED, actor, changed)
            audit_append(
                kind=AuditKind.RECONCILIATION_INVALIDATED,
                operation=locked,
                actor=actor,
                data={"request_id": request.pk, "action": request.action, "why": changed},
            )
            raise RecoveryError(ErrorCode.REQUEST_INVALIDATED, f"nothing was done: {changed}")
        _request_closed(request, ReconciliationRequest.Status.APPROVED, actor, reason)
        audit_append(
            kind=AuditKind.RECONCILIATION_APPROVED,
            operation=locked,
            actor=actor,
            data={
                "request_id": request.pk,
                "action": request.action,
                "reason": reason,
                "proposed_by": str(request.proposed_by),
            },
        )
        apply_decision(
            locked,
            request.action,
            actor,
            request.reason,
            evidence=backing,
            request=None if backing is not None else request,
        )
        return Decided(locked, request.action, request)


def reconciliation_reject(
    *, operation: Operation, request_id: int, reason: str, actor: Actor
) -> ReconciliationRequest:
    """Reject a pending proposal; nothing else changes.

    Needs ``approve_reconciliations``: a proposer withdraws their own this way only if
    they may also approve proposals.
    """
    operator_permitted(
        operation=operation,
        action="reject",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with audit_transaction():
        locked, request = _request_locked(operation, request_id)
        if request.status == ReconciliationRequest.Status.PENDING:
            _request_closed(request, ReconciliationRequest.Status.REJECTED, actor, reason)
            audit_append(
                kind=AuditKind.RECONCILIATION_REJECTED,
                operation=locked,
                actor=actor,
                data={"request_id": request.pk, "action": request.action, "reason": reason},
            )
            return request
    operator_refusals(operation, "reject", actor).refuse(
        RecoveryError(ErrorCode.ALREADY_DECIDED, f"the request is already {request.status}")
    )
