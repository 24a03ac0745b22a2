"""Reads that start from the caller: a host, an approver or a console user.

Each ``*_for_*`` selector returns only what that caller may see; views, services and the
console start every query from one of them, so a check cannot be forgotten in one place.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from guardian.shortcuts import get_objects_for_user

from approvals.actors import Actor
from approvals.models import Approval, Approver, Permit
from approvals.selectors import permit_history
from recovery import contract
from recovery.models import Dispatch, Evidence, Host, Operation, Provider
from recovery.services.errors import NotFound, RecoveryError


def operations_for_host(*, host: Host) -> QuerySet[Operation]:
    return Operation.objects.filter(host=host).select_related("provider", "host")


def operations_for_approver(*, approver: Approver) -> QuerySet[Operation]:
    """The operations ``approver`` may decide for: its providers, and its hosts if any."""
    return Operation.objects.filter(approver.scope(provider="provider__name", host="host__name"))


def providers_for_user(*, user: Any, permissions: tuple[str, ...]) -> QuerySet[Provider]:
    """The providers on which ``user`` holds any of ``permissions`` (object or global)."""
    return get_objects_for_user(
        user,
        [f"recovery.{name}" for name in permissions],
        klass=Provider,
        any_perm=True,
        accept_global_perms=True,
    )


def approvals_for_approver(*, approver: Approver) -> QuerySet[Approval]:
    return Approval.objects.filter(approver.scope(provider="provider", host="host"))


def approvals_for_user(*, user: Any) -> QuerySet[Approval]:
    """Approvals of the providers whose operations ``user`` may view or decide."""
    names = providers_for_user(user=user, permissions=("view_operations", "decide_approvals"))
    return Approval.objects.filter(provider__in=names.values("name"))


def approval_for_caller(
    *, approval_id: Any, approver: Approver | None = None, user: Any = None, decide: bool = False
) -> Approval:
    """One approval, for an approver or a console user.

    Outside what the caller may see it does not exist (``unknown_approval``); a user who
    may see it but not decide it is ``forbidden`` when ``decide``.
    """
    if approver is not None:
        approvals = approvals_for_approver(approver=approver)
    else:
        approvals = approvals_for_user(user=user)
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise NotFound("unknown_approval", "no such approval")
    if decide and user is not None:
        deciding = providers_for_user(user=user, permissions=("decide_approvals",))
        if not deciding.filter(name=approval.provider).exists():
            raise RecoveryError("forbidden", "you may not decide approvals for this provider")
    return approval


def provider_for_callback(*, name: str) -> Provider:
    """The provider a signed callback names (its signature is checked next)."""
    # PostgreSQL cannot even compare a text containing NUL: such a name names nothing.
    provider = None
    if "\x00" not in name and len(name) <= 100:
        provider = Provider.objects.filter(name=name).first()
    if provider is None:
        raise NotFound("unknown_provider", "no such provider")
    return provider


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
    dispatch = Dispatch.objects.filter(operation=operation).first()
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
        evidence=[evidence_record(e) for e in operation.evidence.order_by("captured_at", "id")],
    )
