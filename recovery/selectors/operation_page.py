"""The operation page: its timeline, permit history, lookup in flight and comparison.

The comparison is what differs between the intended action, the provider's evidence
and the receipt. Each takes an operation (or its record) already read through
``recovery.selectors.access.operation_for_user``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import TextChoices
from django.utils import timezone

from approvals.models import Permit
from approvals.selectors import permit_history
from recovery import contract
from recovery.models import LOOKUP_IN_FLIGHT, AuditEvent, LookupAttempt, Operation
from recovery.params_diff import (
    ParamDifference,
    ParamRow,
    params_diff,
    params_rows,
    provider_digest,
    provider_params,
)
from recovery.selectors.records import _iso, _who
from recovery.vocabulary import AuditKind, StaleSignal

TIMELINE_LIMIT = 200


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    kind: str  # an audit event's kind, or "lookup" for a lookup attempt
    actor: str
    summary: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Timeline:
    entries: list[TimelineEntry]  # newest first
    truncated: bool  # older entries exist beyond ``entries``


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    return "" if value is None else str(value)


def _label(words: type[TextChoices], value: str) -> str:
    """A word's label; one this version does not know (written by another) still reads."""
    if value in words.values:
        return str(words(value).label)
    return value.replace("_", " ").capitalize()


def _event_summary(kind: str, data: dict[str, Any]) -> str:
    """One line for an audit event: what its data says, or its kind's label."""

    def get(name: str) -> str:
        return _text(data, name)

    if kind == AuditKind.TRANSITION:
        line = f"{get('from')} → {get('to')} ({get('event').replace('_', ' ')})"
        why = get("verdict") or get("reason")
        return f"{line}: {why.replace('_', ' ')}" if why else line
    if kind == AuditKind.EVIDENCE:
        status = f", provider says {get('provider_status')}" if get("provider_status") else ""
        return f"Evidence from a {get('source')}: {get('verdict')}{status}"
    if kind == AuditKind.STALE_SIGNAL:
        return f"Stale signal, not applied: {_label(StaleSignal, get('signal'))}"
    if kind == AuditKind.OPERATOR_ACTION:
        reason = f": “{get('reason')}”" if get("reason") else ""
        return f"Operator asked to {get('action')}{reason}"
    if kind == AuditKind.OPERATOR_REFUSED:
        return f"Operator's {get('action')} refused ({get('code')})"
    if kind == AuditKind.RECEIPT_RECOVERED:
        grounds = (
            f"four-eyes request #{get('request_id')}"
            if get("request_id")
            else f"evidence #{get('evidence_id')}"
        )
        return f"Receipt completed from {grounds}: {get('status')}"
    if kind == AuditKind.RECONCILIATION_PROPOSED:
        return f"Proposed {get('action')} for a second operator: “{get('reason')}”"
    if kind in (AuditKind.RECONCILIATION_APPROVED, AuditKind.RECONCILIATION_REJECTED):
        verb = "approved" if kind == AuditKind.RECONCILIATION_APPROVED else "rejected"
        return f"Proposed {get('action')} {verb}: “{get('reason')}”"
    if kind == AuditKind.RECONCILIATION_INVALIDATED:
        return f"Proposed {get('action')} invalidated: {get('why')}"
    if kind == AuditKind.LOOKUP_ABANDONED:
        return f"Lookup #{get('lookup_id')} abandoned ({get('reason').replace('_', ' ')})"
    if kind == AuditKind.CONSUME_REFUSED:
        return f"Permit consumption refused: {get('reason')}"
    if kind == AuditKind.HOST_REPORT:
        return f"Host reported {get('outcome') or 'a result'}"
    return _label(AuditKind, kind)


def _lookup_entry(attempt: LookupAttempt) -> TimelineEntry:
    summary = f"Lookup ({attempt.trigger}) {attempt.status}"
    if attempt.evidence is not None:
        summary += f": {attempt.evidence.verdict}"
    return TimelineEntry(
        at=attempt.started_at,
        kind="lookup",
        actor="",  # the trigger, in the summary: the actor is on the chain's own events
        summary=summary,
        detail={
            "lookup_id": attempt.pk,
            "status": attempt.status,
            "started_at": attempt.started_at.isoformat(),
            "finished_at": _iso(attempt.finished_at),
            "evidence_id": attempt.evidence_id,
        },
    )


def operation_timeline(*, operation: Operation, limit: int = TIMELINE_LIMIT) -> Timeline:
    """The operation's audit chain and its lookup attempts, merged, newest first.

    Both are read newest first and at most ``limit + 1`` of each (the chain along its
    (operation_key, seq) index): a long-stuck operation's page costs the same as a new
    one's, and the extra row says whether older entries were left out.
    """
    events = AuditEvent.objects.filter(operation_key=operation.key).order_by("-seq")[: limit + 1]
    attempts = (
        LookupAttempt.objects.filter(operation=operation)
        .select_related("evidence")
        .order_by("-started_at", "-id")[: limit + 1]
    )
    entries = []
    for event in events:
        # The chain accepts any JSON; a kind written later may not hold an object.
        data = event.data if isinstance(event.data, dict) else {"data": event.data}
        entries.append(
            TimelineEntry(
                at=event.at,
                kind=event.kind,
                actor=_who(event.actor),
                summary=_event_summary(event.kind, data),
                detail=data,
            )
        )
    entries += [_lookup_entry(attempt) for attempt in attempts]
    entries.sort(key=lambda entry: entry.at, reverse=True)  # stable: the chain's order holds
    return Timeline(entries[:limit], len(entries) > limit)


@dataclass(frozen=True)
class PermitHistory:
    permit_id: str
    approval_id: str
    status: str
    issued_at: datetime
    expires_at: datetime
    lines: list[dict[str, Any]]  # oldest first: kind, reason, actor, at, detail


def operation_permit_history(*, operation: Operation) -> list[PermitHistory]:
    """Every permit issued for the operation with its whole history, oldest permit first.

    Issue, each consumption attempt and refusal with its reason, revocation and expiry
    (``approvals.selectors.permit_history``). Bound to the key by value, as permits are.
    """
    permits = (
        Permit.objects.filter(operation_key=operation.key)
        .select_related("approval")
        .prefetch_related("events")
        .order_by("issued_at")
    )
    return [
        PermitHistory(
            permit_id=str(permit.id),
            approval_id=str(permit.approval_id),
            status=permit.status,
            issued_at=permit.issued_at,
            expires_at=permit.expires_at,
            lines=[{**line, "actor": _who(line["actor"])} for line in permit_history(permit)],
        )
        for permit in permits
    ]


def lookup_in_flight(*, operation: Operation) -> LookupAttempt | None:
    """The operation's lookup that is queued or running under a live lease, if any.

    One whose lease lapsed will never finish (the next claim abandons it): a page
    waiting for it would wait for ever.
    """
    return (
        LookupAttempt.objects.filter(
            operation=operation, status__in=LOOKUP_IN_FLIGHT, lease_expires_at__gt=timezone.now()
        )
        .order_by("-started_at")
        .first()
    )


@dataclass(frozen=True)
class Comparison:
    """What differs between the intended action, the provider's evidence and the receipt."""

    intended_rows: list[ParamRow]
    provider_rows: list[ParamRow] | None  # None: the evidence holds no parameters
    differences: list[ParamDifference]
    provider_digest: str | None
    digest_differs: bool
    receipt_differs: frozenset[str]  # of "reference", "status"


# A receipt's status and the provider's, when they say the same.
_SAME_OUTCOME = {("succeeded", "committed"), ("failed", "failed")}


def operation_comparison(*, record: contract.OperationRecord) -> Comparison:
    """The intended action against the latest evidence, and the receipt against it."""
    latest = record.evidence[-1] if record.evidence else None
    raw = latest.raw if latest is not None else None
    theirs = provider_params(raw)
    differences = params_diff(record.params, theirs) if theirs is not None else []
    digest = provider_digest(raw)
    receipt_differs: set[str] = set()
    receipt = record.receipt
    if receipt is not None and latest is not None and latest.verdict in ("match", "mismatch"):
        if receipt.provider_reference and receipt.provider_reference != latest.provider_reference:
            receipt_differs.add("reference")
        outcome = (receipt.status, latest.provider_status)
        if receipt.status != "running" and outcome not in _SAME_OUTCOME:
            receipt_differs.add("status")
    return Comparison(
        intended_rows=params_rows(record.params, differences),
        provider_rows=params_rows(theirs, differences) if theirs is not None else None,
        differences=differences,
        provider_digest=digest,
        digest_differs=digest is not None and digest != record.params_digest,
        receipt_differs=frozenset(receipt_differs),
    )
