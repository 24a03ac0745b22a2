"""Reads that start from the caller: a host, an approver or a console user.

Each ``*_for_*`` selector returns only what that caller may see; views, services and the
console start every query from one of them, so a check cannot be forgotten in one place.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import (
    Q,
    QuerySet,
    TextChoices,
)
from django.utils import timezone

from approvals.models import Permit
from approvals.selectors import permit_history
from recovery import contract
from recovery.audit import SYSTEM_CHAIN
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    AuditCheckpoint,
    AuditEvent,
    AuditVerification,
    LookupAttempt,
    Operation,
)
from recovery.params_diff import (
    ParamDifference,
    ParamRow,
    params_diff,
    params_rows,
    provider_digest,
    provider_params,
)
from recovery.selectors.access import (
    approval_for_caller,
    approvals_for_approver,
    approvals_for_user,
    audit_supervisor,
    operation_for_user,
    operations_for_approver,
    operations_for_host,
    provider_for_callback,
    provider_permissions,
    providers_for_user,
    providers_visible_to,
)
from recovery.selectors.queue import (
    QUEUE_AGES,
    QUEUE_REASONS,
    QUEUE_STATES,
    QUEUE_STRANDED,
    QueueFilters,
    QueuePage,
    claim_cutoff,
    operation_jump_for_user,
    operations_queue_counts_for_user,
    operations_queue_for_user,
)
from recovery.selectors.reconciliations import (
    RECONCILIATIONS_SHOWN,
    ProposalRow,
    reconciliation_request_for_user,
    reconciliation_requests_for_user,
)
from recovery.selectors.records import (
    _iso,
    _who,
    approval_record,
    evidence_record,
    operation_record,
    permit_record,
)
from recovery.vocabulary import AuditKind, StaleSignal

# -- the operation page: its history, and what differs between its columns --------------

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


# -- the audit trail: the events a console user may read ----------------------------------


@dataclass(frozen=True)
class AuditFilters:
    """What the audit trail is narrowed to; every field optional, all of them combine."""

    actor: str = ""  # a name, or kind:name (user:olivia, system:sweep)
    key: str = ""  # one operation's key: its chain
    kind: str = ""  # an event kind (transition, operator_action, ...)
    provider: str = ""  # a provider's name: the chains of its operations
    since: datetime | None = None  # at or after
    until: datetime | None = None  # before


@dataclass(frozen=True)
class AuditPage:
    rows: list[AuditEvent]
    next_after: int | None  # the id below which the next page starts


def _actor_filter(text: str) -> Q:
    """``name`` or ``kind:name`` against the stored ``kind:id:name`` (or legacy ``kind:name``)."""
    kind, sep, name = text.partition(":")
    if not sep:
        return Q(actor__regex=rf"^[^:]+:([^:]*:)?{re.escape(text)}$")
    return Q(actor__regex=rf"^{re.escape(kind)}:([^:]*:)?{re.escape(name)}$")


def _audit_branches(*, user: Any, filters: AuditFilters) -> list[QuerySet[AuditEvent]]:
    """The chains ``user`` may read, as one query per kind of chain, filters applied.

    The operations' chains and the system chain are read apart and merged by the
    caller: an OR of the two makes PostgreSQL hash every visible operation's key on
    every page, where alone each walks the events backwards along an index.
    """
    visible = providers_visible_to(user=user)
    if filters.provider:
        visible = visible.filter(name=filters.provider)
    # The provider ids as values, not a subquery: then the planner knows how many
    # operations (and so events) they hold, and either walks the newest events back
    # checking each one's operation (a large share) or reads the few operations' chains
    # through (operation_key, seq) and sorts them (a small share).
    provider_ids = list(visible.values_list("pk", flat=True))
    operations = Operation.objects.filter(provider__in=provider_ids).values("key")
    branches = [AuditEvent.objects.filter(operation_key__in=operations)]
    if not filters.provider and not filters.key and audit_supervisor(user=user):
        branches.append(AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN))
    return [_audit_filtered(events, filters) for events in branches]


def _audit_filtered(events: QuerySet[AuditEvent], filters: AuditFilters) -> QuerySet[AuditEvent]:
    if filters.key:
        events = events.filter(operation_key=filters.key)
    if filters.kind:
        events = events.filter(kind=filters.kind)
    if filters.actor:
        events = events.filter(_actor_filter(filters.actor))
    if filters.since is not None:
        events = events.filter(at__gte=filters.since)
    if filters.until is not None:
        events = events.filter(at__lt=filters.until)
    return events


def audit_events_for_user(
    *, user: Any, filters: AuditFilters, after: int | None, limit: int
) -> AuditPage:
    """One page of the audit trail ``user`` may read, newest first.

    The events of operations of the providers ``user`` may view, and for supervisors
    (``audit_supervisor``) the system chain. Keyset pagination on id: no OFFSET, no
    COUNT; one row beyond ``limit`` says whether there is a next page.
    """
    rows: list[AuditEvent] = []
    for events in _audit_branches(user=user, filters=filters):
        if after is not None:
            events = events.filter(id__lt=after)
        rows.extend(events.order_by("-id")[: limit + 1])
    rows.sort(key=lambda event: event.pk, reverse=True)
    if len(rows) <= limit:
        return AuditPage(rows, None)
    return AuditPage(rows[:limit], rows[limit - 1].pk)


def audit_events_export_for_user(
    *, user: Any, filters: AuditFilters, chunk_size: int = 2000
) -> Iterator[AuditEvent]:
    """Every event of the filtered trail, oldest first, read in chunks.

    On PostgreSQL ``iterator`` reads through a server-side cursor (one per branch,
    merged by id as they go): a million events never sit in memory at once. Oldest
    first, so that each chain reads in its order.
    """
    return heapq.merge(
        *(
            events.order_by("id").iterator(chunk_size=chunk_size)
            for events in _audit_branches(user=user, filters=filters)
        ),
        key=lambda event: event.pk,
    )


@dataclass(frozen=True)
class AuditHealth:
    """When the log was last verified and checkpointed, as the console shows it."""

    verification: AuditVerification | None
    checkpoint: AuditCheckpoint | None
    problem_visible: bool  # the problem names a chain: supervisors only


def audit_health_for_user(*, user: Any) -> AuditHealth:
    """The newest verification and checkpoint; the problem's detail for supervisors only.

    Everyone who reads any of the trail may know whether the log verified; where it
    broke names an operation key, possibly of a provider they may not view.
    """
    return AuditHealth(
        verification=AuditVerification.objects.order_by("-at", "-id").first(),
        checkpoint=AuditCheckpoint.objects.order_by("-number").first(),
        problem_visible=audit_supervisor(user=user),
    )


__all__ = [
    "QUEUE_AGES",
    "QUEUE_REASONS",
    "QUEUE_STATES",
    "QUEUE_STRANDED",
    "RECONCILIATIONS_SHOWN",
    "TIMELINE_LIMIT",
    "AuditFilters",
    "AuditHealth",
    "AuditPage",
    "Comparison",
    "PermitHistory",
    "ProposalRow",
    "QueueFilters",
    "QueuePage",
    "Timeline",
    "TimelineEntry",
    "approval_for_caller",
    "approval_record",
    "approvals_for_approver",
    "approvals_for_user",
    "audit_events_export_for_user",
    "audit_events_for_user",
    "audit_health_for_user",
    "audit_supervisor",
    "claim_cutoff",
    "evidence_record",
    "lookup_in_flight",
    "operation_comparison",
    "operation_for_user",
    "operation_jump_for_user",
    "operation_permit_history",
    "operation_record",
    "operation_timeline",
    "operations_for_approver",
    "operations_for_host",
    "operations_queue_counts_for_user",
    "operations_queue_for_user",
    "permit_record",
    "provider_for_callback",
    "provider_permissions",
    "providers_for_user",
    "providers_visible_to",
    "reconciliation_request_for_user",
    "reconciliation_requests_for_user",
]
