"""The API objects built from rows: what the host and approver APIs return.

Shaped as ``recovery.contract`` says. Each takes a row its caller may already read
(``recovery.selectors.access``). Actors read as kind and name (ids stay inside), times
as ISO 8601.
"""

from __future__ import annotations

from typing import Any

from approvals.actors import Actor
from approvals.models import Approval, Permit
from approvals.selectors import permit_history
from recovery import contract
from recovery.models import Dispatch, Evidence, Operation


def approval_record(*, approval: Approval) -> contract.ApprovalRecord:
    """What an approver sees before deciding: the action, its parameters, its digest."""
    operation = Operation.objects.filter(key=approval.operation_key).first()
    permit = Permit.objects.filter(approval=approval).first()
    return contract.ApprovalRecord(
        approval_id=str(approval.id),
        status=approval.status,
        operation_key=approval.operation_key,
        action=approval.action,
        provider=approval.provider,
        host=approval.host,
        params=operation.params if operation is not None else None,
        params_digest=approval.params_digest,
        requested_at=approval.created_at.isoformat(),
        decided_by=_who(approval.decided_by),
        decided_at=_iso(approval.decided_at),
        permit_id=str(permit.id) if permit else None,
        expires_at=_iso(permit.expires_at) if permit else None,
    )


def _who(actor: Actor | None) -> str:
    """An actor as hosts and approvers read it: kind and name (ids stay inside)."""
    return str(actor) if actor is not None else ""


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def permit_record(permit: Permit) -> contract.PermitRecord:
    return contract.PermitRecord(
        permit_id=str(permit.id),
        approval_id=str(permit.approval_id),
        status=permit.status,
        params_digest=permit.params_digest,
        issued_at=permit.issued_at.isoformat(),
        expires_at=permit.expires_at.isoformat(),
        consumed_at=_iso(permit.consumed_at),
        revoked_at=_iso(permit.revoked_at),
        history=[
            contract.PermitLine(
                kind=line["kind"],
                reason=line["reason"],
                actor=_who(line["actor"]),
                at=line["at"].isoformat(),
                detail=line["detail"],
            )
            for line in permit_history(permit)
        ],
    )


def evidence_record(evidence: Evidence) -> contract.EvidenceRecord:
    return contract.EvidenceRecord(
        evidence_id=evidence.pk,
        source=evidence.source,
        verdict=evidence.verdict,
        provider_status=evidence.provider_status,
        provider_reference=evidence.provider_reference,
        detail=evidence.detail,
        raw=evidence.raw,
        raw_digest=evidence.raw_digest,
        captured_at=evidence.captured_at.isoformat(),
    )


def operation_record(*, operation: Operation) -> contract.OperationRecord:
    """The whole record of one operation, as the host API returns it."""
    permit = (
        Permit.objects.filter(operation_key=operation.key)
        .select_related("approval")
        .prefetch_related("events")
        .order_by("-issued_at")
        .first()
    )
    return operation_record_of(
        operation=operation,
        permit=permit,
        dispatch=Dispatch.of(operation),
        evidence=list(operation.evidence.order_by("captured_at", "id")),
    )


def operation_record_of(
    *,
    operation: Operation,
    permit: Permit | None,
    dispatch: Dispatch | None,
    evidence: list[Evidence],
) -> contract.OperationRecord:
    """``operation_record`` from rows already read: its newest permit (with its events),
    its dispatch and its evidence, oldest first."""
    return contract.OperationRecord(
        key=operation.key,
        action=operation.action,
        provider=operation.provider.name,
        params=operation.params,
        params_digest=operation.params_digest,
        state=operation.state,
        version=operation.version,
        recovered=operation.recovered,
        created_at=operation.created_at.isoformat(),
        updated_at=operation.updated_at.isoformat(),
        permit=permit_record(permit) if permit else None,
        dispatch=(
            contract.DispatchRecord(
                worker=dispatch.worker,
                permit_id=str(dispatch.permit_id),
                created_at=dispatch.created_at.isoformat(),
                lease_expires_at=dispatch.lease_expires_at.isoformat(),
                last_heartbeat_at=_iso(dispatch.last_heartbeat_at),
            )
            if dispatch
            else None
        ),
        receipt=(
            contract.ReceiptRecord(
                status=dispatch.receipt_status,
                provider_reference=dispatch.receipt_reference,
                recovered=dispatch.receipt_recovered,
                evidence_id=dispatch.receipt_evidence_id,
                reported_at=_iso(dispatch.receipt_reported_at),
            )
            if dispatch
            else None
        ),
        evidence=[evidence_record(e) for e in evidence],
    )
