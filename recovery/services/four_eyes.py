"""Four eyes: a second operator approves or rejects a proposed reconciliation.

A proposal (``recovery.services.reconcile``) is bound to the operation's version and
latest evidence as the proposer saw them: if either moved on, approving it invalidates
it instead. Approving and the change it approves are one transaction; the proposer
never approves their own. Every approval, rejection, invalidation and refusal is an
audit event on the operation's chain.

A decision may be signed with the decider's passkey (``common.statements``, kind
``reconciliation``): the signature is kept on the request and in its audit event.
Where the policy in force requires passkeys for the provider, only signed ones count.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.chain import audit_append
from audit.kinds import AuditKind
from common import statements
from common.actors import Actor
from common.errors import ErrorCode
from policies.services import passkey_required_for
from recovery.models import Dispatch, Evidence, Operation
from recovery.permissions import ProviderPermission
from recovery.services.errors import RecoveryError
from recovery.services.locking import operation_lock
from recovery.services.operator import OperatorRefusals, operator_permitted
from recovery.services.reconcile import Decided, apply_decision, evidence_latest, reconcile_grounds
from recovery.services.refusals import refusals_recorded
from recovery.services.signed import signed_decision_check


def _request_locked(
    operation: Operation, request_id: int
) -> tuple[Operation, ReconciliationRequest]:
    """The operation, then its request (the lock order: operation, then approvals rows)."""
    locked = operation_lock(operation)
    request = ReconciliationRequest.objects.select_for_update().get(
        pk=request_id, operation_key=locked.key
    )
    return locked, request


def _request_closed(
    request: ReconciliationRequest,
    status: str,
    actor: Actor,
    reason: str,
    signature: dict[str, Any] | None = None,
) -> None:
    request.status = status
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason[:500]
    request.signature = signature or {}
    request.save(
        update_fields=["status", "decided_by", "decided_at", "decision_reason", "signature"]
    )


def reconciliation_subject(request: ReconciliationRequest) -> dict[str, object]:
    """What a signed decision on ``request`` names
    (``common.statements.reconciliation_subject``)."""
    return statements.reconciliation_subject(
        request_id=request.pk,
        operation_key=request.operation_key,
        params_digest=request.params_digest,
        action=request.action,
    )


def _signature_check(
    request: ReconciliationRequest,
    decision: str,
    actor: Actor,
    signature: dict[str, Any] | None,
) -> dict[str, Any]:
    """What the decision's audit event adds for its signature, once it is found to sign
    this request, as proposed, with this decision, by this person; refused unsigned
    where the policy requires passkeys for its provider."""
    signed_decision_check(
        signature,
        required=not signature and passkey_required_for([request.provider]),
        kind="reconciliation",
        decision=decision,
        actor=actor,
        **reconciliation_subject(request),
    )
    return {"params_digest": request.params_digest, "signature": signature} if signature else {}


def _pending_locked(
    operation: Operation, request_id: int
) -> tuple[Operation, ReconciliationRequest]:
    """``_request_locked``, refused unless the request still waits for its decision."""
    locked, request = _request_locked(operation, request_id)
    if request.status != ReconciliationRequest.Status.PENDING:
        raise RecoveryError(ErrorCode.ALREADY_DECIDED, f"the request is already {request.status}")
    return locked, request


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
    *,
    operation: Operation,
    request_id: int,
    reason: str,
    actor: Actor,
    signature: dict[str, Any] | None = None,
    batch_signed: bool = False,
) -> Decided:
    """Approve another operator's proposal and take the decision, in one transaction.

    Refused without ``approve_reconciliations``, for the proposer (``self_approval``),
    for a request already decided, and for an unsigned decision the policy wants signed
    (``passkey_required``) or a signature of another (``signature_invalid``); a request
    whose operation or evidence moved on since the proposal is invalidated
    (``request_invalidated``). ``batch_signed``: the approval is an item of a bulk batch
    whose decision was signed, its statement naming this operation at its version
    (``bulk.services``), so it counts as signed.
    """
    operator_permitted(
        operation=operation,
        action="approve",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with OperatorRefusals(operation, "approve", actor):
        locked, request = _pending_locked(operation, request_id)
        if request.proposed_by == actor:
            raise RecoveryError(
                ErrorCode.SELF_APPROVAL, "a proposal needs a second operator: you proposed this one"
            )
        signed = {} if batch_signed else _signature_check(request, "approve", actor, signature)
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
        _request_closed(request, ReconciliationRequest.Status.APPROVED, actor, reason, signature)
        audit_append(
            kind=AuditKind.RECONCILIATION_APPROVED,
            operation=locked,
            actor=actor,
            data={
                "request_id": request.pk,
                "action": request.action,
                "reason": reason,
                "proposed_by": str(request.proposed_by),
                **signed,
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


@refusals_recorded()
def reconciliation_reject(
    *,
    operation: Operation,
    request_id: int,
    reason: str,
    actor: Actor,
    signature: dict[str, Any] | None = None,
) -> ReconciliationRequest:
    """Reject a pending proposal; nothing else changes.

    Needs ``approve_reconciliations``: a proposer withdraws their own this way only if
    they may also approve proposals. Signed, or refused, as ``reconciliation_approve``.
    """
    operator_permitted(
        operation=operation,
        action="reject",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with OperatorRefusals(operation, "reject", actor):
        locked, request = _pending_locked(operation, request_id)
        signed = _signature_check(request, "reject", actor, signature)
        _request_closed(request, ReconciliationRequest.Status.REJECTED, actor, reason, signature)
        audit_append(
            kind=AuditKind.RECONCILIATION_REJECTED,
            operation=locked,
            actor=actor,
            data={
                "request_id": request.pk,
                "action": request.action,
                "reason": reason,
                **signed,
            },
        )
        return request
