"""The API objects built from rows: what the host and approver APIs return.

Shaped as ``recovery.contract`` says. Each takes a row its caller may already read
(``recovery.selectors.access``). Actors read as kind and name (ids stay inside), times
as ISO 8601.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any
from urllib.parse import quote, urlencode

from approvals.models import Approval, Permit, PermitEvent
from approvals.selectors import approval_needed, permit_history
from common.actors import Actor
from common.links import approval_link_url
from recovery import contract
from recovery.models import Dispatch, Evidence, Operation


def approval_needs(*, approval: Approval, approvals: int | None = None) -> dict[str, Any]:
    """Which rule applied and what the approval still needs (``contract.Needs``' fields).

    Only an approval decided by votes pays a statement to count them, unless the caller
    knows the count (``approvals``: one just opened has none).
    """
    if approvals is not None:
        pass
    elif approval.voting:
        approvals = approval.votes.filter(approve=True).count()
    else:
        by_person = isinstance(approval.decided_by, Actor) and approval.decided_by.kind != "system"
        approvals = 1 if approval.status == Approval.Status.APPROVED and by_person else 0
    return {
        "rule": approval.rule,
        "required": approval.required,
        "approvals": approvals,
        "needed": approval_needed(approval=approval, approvals=approvals),
    }


def approval_customer(*, approval: Approval, to_host: bool) -> dict[str, Any]:
    """The customer fields of an approval's answer: its ``party`` and, to the host that
    opened it while it is pending and addressed to the customer, its ``link`` and when
    it expires. Staff never get the link: it decides as the customer."""
    fields: dict[str, Any] = {}
    if approval.party_id is None:
        return fields
    party = approval.party
    assert party is not None
    fields["party"] = contract.PartyRecord(
        id=party.party,
        name=party.display_name,
        **({"contact": party.contact} if to_host else {}),
    )
    if to_host and approval.customer and approval.status == Approval.Status.PENDING:
        fields["link"] = approval_link_url(approval.id)
        fields["expires_at"] = _iso(approval.expires_at)
    return fields


def approval_record(*, approval: Approval, to_host: bool = False) -> contract.ApprovalRecord:
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
        **{
            "expires_at": _iso(permit.expires_at) if permit else None,
            **approval_customer(approval=approval, to_host=to_host),
        },
        **approval_needs(approval=approval),
    )


def approval_opened_record(approval: Approval, created: bool) -> contract.ApprovalOpened:
    """An approval as its opening answers it (``created``: opened by that call)."""
    # A policy that approved it issued the permit in this call (the approval holds it).
    permit = approval.permit if approval.status == Approval.Status.APPROVED else None
    return contract.ApprovalOpened(
        approval_id=str(approval.id),
        status=approval.status,
        permit_id=str(permit.id) if permit else None,
        **{
            "expires_at": permit.expires_at.isoformat() if permit else None,
            **approval_customer(approval=approval, to_host=True),
        },
        # One just opened has no votes yet: nothing to count.
        **approval_needs(approval=approval, approvals=0 if created else None),
    )


def _who(actor: Actor | None) -> str:
    """An actor as hosts and approvers read it: kind and name (ids stay inside)."""
    return str(actor) if actor is not None else ""


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _history_lines(lines: list[dict[str, Any]]) -> list[contract.PermitLine]:
    return [
        contract.PermitLine(
            kind=line["kind"],
            reason=line["reason"],
            actor=_who(line["actor"]),
            at=line["at"].isoformat(),
            detail=line["detail"],
        )
        for line in lines
    ]


def permit_history_page(
    *, permit: Permit, after: int | None = None, limit: int = contract.HISTORY_PAGE
) -> contract.HistoryPage:
    """One page of a permit's history, oldest first, along its events' ids.

    The first page (no ``after``) also holds the lines its row records (issue,
    consumption, revocation); ``next`` is the URL of the page after this one, if any.
    """
    events = list(
        PermitEvent.objects.filter(permit=permit, pk__gt=after or 0).order_by("pk")[: limit + 1]
    )
    more = len(events) > limit
    events = events[:limit]
    lines = permit_history(permit, events=events, row=after is None)
    next_url = None
    if more:
        query = urlencode({"after": events[-1].pk, "limit": limit})
        next_url = f"/api/v1/operations/{quote(permit.operation_key, safe='')}/history?{query}"
    return contract.HistoryPage(
        permit_id=str(permit.id), lines=_history_lines(lines), next=next_url
    )


def permit_record(
    permit: Permit, page: contract.HistoryPage | None = None
) -> contract.PermitRecord:
    """``page``: the first page of its history, if the caller read it already."""
    if page is None:
        page = permit_history_page(permit=permit)
    return contract.PermitRecord(
        permit_id=str(permit.id),
        approval_id=str(permit.approval_id),
        status=permit.status,
        params_digest=permit.params_digest,
        issued_at=permit.issued_at.isoformat(),
        expires_at=permit.expires_at.isoformat(),
        consumed_at=_iso(permit.consumed_at),
        revoked_at=_iso(permit.revoked_at),
        history=page.lines,
        history_next=page.next,
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
    permit = newest_permit(operation_key=operation.key)
    return operation_record_of(
        operation=operation,
        permit=permit,
        dispatch=Dispatch.of(operation),
        evidence=list(operation.evidence.order_by("captured_at", "id")),
    )


def newest_permit(*, operation_key: str) -> Permit | None:
    """The operation's newest permit, with its approval: the one its record shows."""
    return (
        Permit.objects.filter(operation_key=operation_key)
        .select_related("approval")
        .order_by("-issued_at")
        .first()
    )


def operation_record_of(
    *,
    operation: Operation,
    permit: Permit | None,
    dispatch: Dispatch | None,
    evidence: list[Evidence],
    page: contract.HistoryPage | None = None,
) -> contract.OperationRecord:
    """``operation_record`` from rows already read: its newest permit (and the first
    page of its history, if read), its dispatch and its evidence, oldest first."""
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
        permit=permit_record(permit, page) if permit else None,
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
                result=dispatch.receipt_result,
            )
            if dispatch
            else None
        ),
        evidence=[evidence_record(e) for e in evidence],
    )


def operations_params_canonical(keys: Collection[str]) -> dict[str, str]:
    """Each operation's parameters as canonical JSON, by key, for those of ``keys`` that
    exist: what an approver's message shows (``approvals.notices.ParamsOf``).

    Read by beat's task for every approver alike, so no caller limits it.
    """
    return dict(Operation.objects.filter(key__in=keys).values_list("key", "params_canonical"))
