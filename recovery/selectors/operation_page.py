"""The operation page: its timeline, permit history, lookup in flight and comparison.

The comparison is what differs between the intended action, the provider's evidence
and the receipt. Each takes an operation (or its record) already read through
``recovery.selectors.access.operation_for_user``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery, TextChoices
from django.utils import timezone

from approvals.models import Permit, PermitEvent, ReconciliationRequest
from approvals.selectors import permit_history
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.refusals import refusal_code, refusal_message
from recovery import contract
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    OperationClaim,
)
from recovery.params_diff import (
    ParamDifference,
    ParamRow,
    params_diff,
    params_rows,
    provider_digest,
    provider_params,
)
from recovery.selectors.access import providers_visible_to
from recovery.selectors.records import _history_lines, _iso, _who, operation_record_of
from recovery.vocabulary import StaleSignal

TIMELINE_LIMIT = 50  # the newest entries shown; the audit trail holds the rest


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
        return f"Operator's {get('action')} refused ({refusal_code(kind, data)})"
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
        signed = ", signed with a passkey" if data.get("signature") else ""
        return f"Proposed {get('action')} {verb}{signed}: “{get('reason')}”"
    if kind == AuditKind.SIGNATURE_REFUSED:
        why = f"{refusal_code(kind, data)}: {refusal_message(kind, data)}"
        return f"Passkey-signed decision to {get('decision')} refused ({why})"
    if kind == AuditKind.RECONCILIATION_INVALIDATED:
        return f"Proposed {get('action')} invalidated: {get('why')}"
    if kind == AuditKind.LOOKUP_ABANDONED:
        return f"Lookup #{get('lookup_id')} abandoned ({get('reason').replace('_', ' ')})"
    if kind == AuditKind.CONSUME_REFUSED:
        code = refusal_code(kind, data)
        if get("counted"):
            return (
                f"{get('counted')} more {code} refusals between {get('first_at')} "
                f"and {get('last_at')}"
            )
        if get("summary_until"):
            return (
                f"Permit consumption refused: {code}; more until "
                f"{get('summary_until')} are counted in one line of the permit's history"
            )
        return f"Permit consumption refused: {code}"
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


def _attempts_newest(attempts: QuerySet[LookupAttempt], limit: int) -> list[LookupAttempt]:
    return list(attempts.select_related("evidence").order_by("-started_at", "-id")[: limit + 1])


def operation_timeline(
    *,
    operation: Operation,
    limit: int = TIMELINE_LIMIT,
    attempts: list[LookupAttempt] | None = None,
) -> Timeline:
    """The operation's audit chain and its lookup attempts, merged, newest first.

    Both are read newest first and at most ``limit + 1`` of each (the chain along its
    (operation_key, seq) index): a long-stuck operation's page costs the same as a new
    one's, and the extra row says whether older entries were left out. ``attempts``:
    those, if the caller read them already (``operation_page_for_user``).
    """
    events = AuditEvent.objects.filter(operation_key=operation.key).order_by("-seq")[: limit + 1]
    if attempts is None:
        attempts = _attempts_newest(LookupAttempt.objects.filter(operation=operation), limit)
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


PERMIT_LINES = 50  # a permit's newest events shown on the page; older ones a link away


@dataclass(frozen=True)
class PermitHistory:
    permit_id: str
    approval_id: str
    status: str
    issued_at: datetime
    expires_at: datetime
    lines: list[dict[str, Any]]  # oldest first: kind, reason, actor, at, detail
    older: int | None = None  # the cursor of the lines before these, if there are any


def operation_permits(*, operation_key: str) -> list[Permit]:
    """The operation's permits, oldest first, each with its approval and its newest
    ``PERMIT_LINES + 1`` events (``events_newest``, newest first)."""
    newest = PermitEvent.objects.order_by("-id")[: PERMIT_LINES + 1]
    return list(
        Permit.objects.filter(operation_key=operation_key)
        .select_related("approval")
        .prefetch_related(Prefetch("events", queryset=newest, to_attr="events_newest"))
        .order_by("issued_at", "id")
    )


def _permit_lines(permit: Permit, events: list[PermitEvent], row: bool) -> PermitHistory:
    """``events`` (newest first, one more than shown if older ones exist) as its lines."""
    shown = events[:PERMIT_LINES]
    older = shown[-1].pk if len(events) > PERMIT_LINES else None
    lines = permit_history(permit, events=reversed(shown), row=row and older is None)
    return PermitHistory(
        permit_id=str(permit.id),
        approval_id=str(permit.approval_id),
        status=permit.status,
        issued_at=permit.issued_at,
        expires_at=permit.expires_at,
        lines=[{**line, "actor": _who(line["actor"])} for line in lines],
        older=older,
    )


def operation_permit_history(
    *, operation: Operation, permits: list[Permit] | None = None
) -> list[PermitHistory]:
    """Every permit issued for the operation with its newest history, oldest permit first.

    Issue, each consumption attempt and refusal with its reason, revocation and expiry
    (``approvals.selectors.permit_history``): the newest ``PERMIT_LINES`` events, and the
    cursor of the older ones (``permit_history_older``). The lines the permit's row
    records (issue, consumption, revocation) come with the oldest page. Bound to the key
    by value, as permits are. ``permits``: ``operation_permits``, if read already.
    """
    if permits is None:
        permits = operation_permits(operation_key=operation.key)
    return [_permit_lines(permit, permit.events_newest, row=True) for permit in permits]  # type: ignore[attr-defined]


def permit_history_older(
    *, operation: Operation, permit_id: Any, before: int
) -> PermitHistory | None:
    """The ``PERMIT_LINES`` lines of one of the operation's permits before ``before``.

    None when the operation has no such permit.
    """
    permit = (
        Permit.objects.filter(pk=permit_id, operation_key=operation.key)
        .select_related("approval")
        .first()
    )
    if permit is None:
        return None
    events = list(permit.events.filter(pk__lt=before).order_by("-id")[: PERMIT_LINES + 1])
    return _permit_lines(permit, events, row=True)


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


@dataclass(frozen=True)
class OperationViewed:
    """An operation as its page first reads it: the row and its newest lookups."""

    operation: Operation  # with its provider, host, dispatch and claim
    attempts: list[LookupAttempt]  # newest first, at most TIMELINE_LIMIT + 1
    in_flight: LookupAttempt | None


def operation_viewed_for_user(*, user: Any, key: str) -> OperationViewed | None:
    """The operation ``key`` and its lookups, or None when there is none or ``user`` may
    not view it: what a poll of its page needs, in two statements.

    The lookups are read before the operation: when none is in flight, the operation
    shown is then at least as new as that answer, and a page never stops polling on a
    state that predates its lookup's outcome.
    """
    visible = providers_visible_to(user=user)
    attempts = _attempts_newest(
        LookupAttempt.objects.filter(operation__key=key, operation__provider__in=visible),
        TIMELINE_LIMIT,
    )
    pending = ReconciliationRequest.objects.filter(
        operation_key=OuterRef("key"), status=ReconciliationRequest.Status.PENDING
    ).values("pk")[:1]
    operation = (
        Operation.objects.filter(key=key, provider__in=visible)
        .select_related("provider", "host", "dispatch", "claim")
        .annotate(pending_request_id=Subquery(pending))
        .first()
    )
    if operation is None:
        return None
    now = timezone.now()
    in_flight = next(
        (a for a in attempts if a.status in LOOKUP_IN_FLIGHT and a.lease_alive(now)), None
    )
    return OperationViewed(operation, attempts, in_flight)


@dataclass(frozen=True)
class OperationPage:
    """Everything the operation page shows, read in a fixed number of statements.

    One statement per kind of thing, whatever the history's length: the lookups and the
    operation (``operation_viewed_for_user``; its provider, host, dispatch and claim with
    it), its permits, their events, its evidence, its audit chain; the pending
    four-eyes proposal only when there is one.
    """

    operation: Operation
    in_flight: LookupAttempt | None
    record: contract.OperationRecord
    timeline: Timeline
    permits: list[PermitHistory]
    dispatch: Dispatch | None
    claim: OperationClaim | None  # a live one: a lapsed claim is as good as none
    evidence_latest: Evidence | None
    pending_request: ReconciliationRequest | None


def operation_page(*, viewed: OperationViewed) -> OperationPage:
    """The rest of the operation page, for an operation its user may view."""
    operation = viewed.operation
    dispatch = _related(operation, "dispatch")
    claim = _related(operation, "claim")
    if claim is not None and claim.lapsed:
        claim = None
    permits = operation_permits(operation_key=operation.key)
    evidence = list(operation.evidence.order_by("captured_at", "id"))
    pending_id = getattr(operation, "pending_request_id", None)
    return OperationPage(
        operation=operation,
        in_flight=viewed.in_flight,
        record=operation_record_of(
            operation=operation,
            permit=permits[-1] if permits else None,
            dispatch=dispatch,
            evidence=evidence,
            page=_record_page(permits[-1]) if permits else None,
        ),
        timeline=operation_timeline(operation=operation, attempts=viewed.attempts),
        permits=operation_permit_history(operation=operation, permits=permits),
        dispatch=dispatch,
        claim=claim,
        evidence_latest=evidence[-1] if evidence else None,
        pending_request=(
            ReconciliationRequest.objects.filter(pk=pending_id).first()
            if pending_id is not None
            else None
        ),
    )


def _record_page(permit: Permit) -> contract.HistoryPage:
    """The newest permit's history in its record, from the events the page read.

    The page shows its lines from ``permits``; the record carries the same, so that no
    statement reads them twice.
    """
    events = permit.events_newest  # type: ignore[attr-defined]
    shown = events[:PERMIT_LINES]
    lines = permit_history(permit, events=reversed(shown), row=len(events) <= PERMIT_LINES)
    return contract.HistoryPage(permit_id=str(permit.id), lines=_history_lines(lines), next=None)


def _related(operation: Operation, name: str) -> Any:
    """A reverse one-to-one read with the operation (``select_related``), or None."""
    try:
        return getattr(operation, name)
    except ObjectDoesNotExist:
        return None
