"""Reads: operations as a given caller may see them, and the whole record of one."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from approvals.actors import Actor
from approvals.models import Approval, Approver, Permit
from approvals.selectors import permit_history
from recovery.models import Dispatch, Evidence, Host, Operation


def operations_for_host(*, host: Host) -> QuerySet[Operation]:
    return Operation.objects.filter(host=host).select_related("provider", "host")


def approval_record(*, approval_id: Any, approver: Approver | None) -> dict[str, Any] | None:
    """What an approver sees before deciding; None outside its scope (or if none such)."""
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None:
        return None
    if approver is not None and not approver.may_decide(
        provider=approval.provider, host=approval.host
    ):
        return None
    operation = Operation.objects.filter(key=approval.operation_key).first()
    permit = Permit.objects.filter(approval=approval).first()
    return {
        "approval_id": str(approval.id),
        "status": approval.status,
        "operation_key": approval.operation_key,
        "action": approval.action,
        "provider": approval.provider,
        "host": approval.host,
        "params": operation.params if operation is not None else None,
        "params_digest": approval.params_digest,
        "requested_at": _iso(approval.created_at),
        "decided_by": _who(approval.decided_by),
        "decided_at": _iso(approval.decided_at),
        "permit_id": str(permit.id) if permit else None,
        "expires_at": _iso(permit.expires_at) if permit else None,
    }


def _who(actor: Actor | None) -> str:
    """An actor as hosts and approvers read it: kind and name (ids stay inside)."""
    return str(actor) if actor is not None else ""


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def permit_record(permit: Permit) -> dict[str, Any]:
    return {
        "permit_id": str(permit.id),
        "approval_id": str(permit.approval_id),
        "status": permit.status,
        "params_digest": permit.params_digest,
        "issued_at": _iso(permit.issued_at),
        "expires_at": _iso(permit.expires_at),
        "consumed_at": _iso(permit.consumed_at),
        "revoked_at": _iso(permit.revoked_at),
        "history": [
            {**line, "actor": _who(line["actor"]), "at": _iso(line["at"])}
            for line in permit_history(permit)
        ],
    }


def evidence_record(evidence: Evidence) -> dict[str, Any]:
    return {
        "evidence_id": evidence.pk,
        "source": evidence.source,
        "verdict": evidence.verdict,
        "provider_status": evidence.provider_status,
        "provider_reference": evidence.provider_reference,
        "detail": evidence.detail,
        "raw": evidence.raw,
        "raw_digest": evidence.raw_digest,
        "captured_at": _iso(evidence.captured_at),
    }


def operation_record(*, operation: Operation) -> dict[str, Any]:
    """The whole record of one operation, as the host API returns it."""
    permit = (
        Permit.objects.filter(operation_key=operation.key)
        .select_related("approval")
        .prefetch_related("events")
        .order_by("-issued_at")
        .first()
    )
    dispatch = Dispatch.objects.filter(operation=operation).first()
    return {
        "key": operation.key,
        "action": operation.action,
        "provider": operation.provider.name,
        "params": operation.params,
        "params_digest": operation.params_digest,
        "state": operation.state,
        "version": operation.version,
        "recovered": operation.recovered,
        "created_at": _iso(operation.created_at),
        "updated_at": _iso(operation.updated_at),
        "permit": permit_record(permit) if permit else None,
        "dispatch": (
            {
                "worker": dispatch.worker,
                "permit_id": str(dispatch.permit_id),
                "created_at": _iso(dispatch.created_at),
                "lease_expires_at": _iso(dispatch.lease_expires_at),
                "last_heartbeat_at": _iso(dispatch.last_heartbeat_at),
            }
            if dispatch
            else None
        ),
        "receipt": (
            {
                "status": dispatch.receipt_status,
                "provider_reference": dispatch.receipt_reference,
                "recovered": dispatch.receipt_recovered,
                "evidence_id": dispatch.receipt_evidence_id,
                "reported_at": _iso(dispatch.receipt_reported_at),
            }
            if dispatch
            else None
        ),
        "evidence": [evidence_record(e) for e in operation.evidence.order_by("captured_at", "id")],
    }
