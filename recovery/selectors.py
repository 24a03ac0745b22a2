"""Reads that start from the caller: a host, an approver or a console user.

Each ``*_for_*`` selector returns only what that caller may see; views, services and the
console start every query from one of them, so a check cannot be forgotten in one place.
"""

from __future__ import annotations

import heapq
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextChoices,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.utils import timezone
from guardian.shortcuts import get_objects_for_user, get_perms

from approvals.actors import Actor
from approvals.models import Approval, Approver, Permit, ReconciliationRequest
from approvals.selectors import permit_history
from recovery import contract
from recovery.audit import SYSTEM_CHAIN
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    AuditCheckpoint,
    AuditEvent,
    AuditVerification,
    Dispatch,
    Evidence,
    Host,
    LookupAttempt,
    Operation,
    OperationClaim,
    Provider,
    State,
)
from recovery.params_diff import (
    ParamDifference,
    ParamRow,
    params_diff,
    params_rows,
    provider_digest,
    provider_params,
)
from recovery.permissions import ProviderPermission
from recovery.services.errors import NotFound
from recovery.vocabulary import AuditKind, StaleSignal, WaitReason


def operations_for_host(*, host: Host) -> QuerySet[Operation]:
    return Operation.objects.filter(host=host).select_related("provider", "host")


def operations_for_approver(*, approver: Approver) -> QuerySet[Operation]:
    """The operations ``approver`` may decide for: its providers, and its hosts if any."""
    return Operation.objects.filter(approver.scope(provider="provider__name", host="host__name"))


def providers_for_user(
    *, user: Any, permissions: tuple[ProviderPermission, ...]
) -> QuerySet[Provider]:
    """The providers on which ``user`` holds any of ``permissions``.

    Object permissions only: a role applies to the providers it was granted on
    (``manage.py grant``, ``recovery.services.roles``); a model-wide permission grants
    nothing here. Superusers see all.
    """
    return get_objects_for_user(
        user,
        [permission.perm for permission in permissions],
        klass=Provider,
        any_perm=True,
        accept_global_perms=False,
    )


def provider_permissions(*, user: Any, provider: Provider) -> frozenset[str]:
    """The permissions ``user`` holds on ``provider`` (codenames), read at once.

    The same object permissions ``providers_for_user`` asks about, for a page that needs
    several answers about one provider.
    """
    if not user.is_active:
        return frozenset()
    return frozenset(get_perms(user, provider))


def approvals_for_approver(*, approver: Approver) -> QuerySet[Approval]:
    return Approval.objects.filter(approver.scope(provider="provider", host="host"))


def approvals_for_user(*, user: Any) -> QuerySet[Approval]:
    """Approvals of the providers whose operations ``user`` may view or decide."""
    names = providers_for_user(
        user=user,
        permissions=(ProviderPermission.VIEW_OPERATIONS, ProviderPermission.DECIDE_APPROVALS),
    )
    return Approval.objects.filter(provider__in=names.values("name"))


def approval_for_caller(
    *, approval_id: Any, approver: Approver | None = None, user: Any = None
) -> Approval:
    """One approval, for an approver or a console user to read.

    Outside what the caller may see it does not exist (``unknown_approval``). Who may
    decide it is the deciding service's rule (``recovery.services.permits``).
    """
    if approver is not None:
        approvals = approvals_for_approver(approver=approver)
    else:
        approvals = approvals_for_user(user=user)
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise NotFound("unknown_approval", "no such approval")
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
    dispatch = Dispatch.of(operation)
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


# -- the operator console: what a console user may see ------------------------------------

QUEUE_STRANDED = WaitReason.STRANDED
QUEUE_STATES = (State.UNKNOWN, State.RECONCILE)

# Why an operation waits, read from its last transition (what the services write in
# its data); a stranded receipt of a settled operation waits for the receipt alone.
QUEUE_REASONS = dict(WaitReason.choices)

# How long an operation has been in its state: (label, newer than, at most this old).
QUEUE_AGES: dict[str, tuple[str, timedelta | None, timedelta | None]] = {
    "hour": ("Under 1 hour", None, timedelta(hours=1)),
    "day": ("1 hour to 1 day", timedelta(hours=1), timedelta(days=1)),
    "week": ("1 to 7 days", timedelta(days=1), timedelta(days=7)),
    "older": ("Over 7 days", timedelta(days=7), None),
}


@dataclass(frozen=True)
class QueueFilters:
    """What the queue is narrowed to; every field optional, all of them combine."""

    state: str = ""  # unknown, reconcile, or stranded (a receipt left running)
    provider: str = ""  # a provider's name
    verdict: str = ""  # the latest evidence's verdict, or "none" for no evidence yet
    search: str = ""  # the start of an operation key (or all of it)
    reason: str = ""  # why it waits: a key of QUEUE_REASONS
    age: str = ""  # how long it has waited in its state: a key of QUEUE_AGES


@dataclass(frozen=True)
class QueuePage:
    rows: list[Operation]
    next_after: tuple[datetime, int] | None  # the keyset cursor of the next page


def providers_visible_to(*, user: Any) -> QuerySet[Provider]:
    """Providers whose operations ``user`` may view."""
    return providers_for_user(user=user, permissions=(ProviderPermission.VIEW_OPERATIONS,))


def _latest_evidence() -> QuerySet[Evidence]:
    return Evidence.objects.filter(operation=OuterRef("pk")).order_by("-captured_at", "-id")


# A QUEUE_REASONS key from a transition's data; otherwise the event's own name.
_REASON_OF_TRANSITION = Case(
    When(data__reason=WaitReason.LOOKUP_BUDGET_SPENT, then=Value(WaitReason.LOOKUP_BUDGET_SPENT)),
    When(data__event="escalate", data__verdict="mismatch", then=Value(WaitReason.MISMATCH)),
    When(data__event="escalate", data__verdict="corrupt", then=Value(WaitReason.CORRUPT)),
    When(data__event="conflict", then=Value(WaitReason.CONFLICT)),
    When(data__event="lease_lost", then=Value(WaitReason.LEASE_LOST)),
    default=KT("data__event"),
    output_field=CharField(),
)


def claim_cutoff(now: datetime | None = None) -> datetime:
    """Claims last touched before this have lapsed (``recovery.services.claims``)."""
    idle = timedelta(minutes=settings.SETTLE_CLAIM_IDLE_MINUTES)
    return (now or timezone.now()) - idle


def _queue_branch(
    rows: QuerySet[Operation], filters: QueueFilters, after: tuple[datetime, int] | None
) -> QuerySet[Operation]:
    if filters.provider:
        rows = rows.filter(provider__name=filters.provider)
    if filters.search:  # a prefix, so that the key's own index can serve it
        rows = rows.filter(key__startswith=filters.search)
    if filters.age in QUEUE_AGES:
        # A range of updated_at, which the queue's index is ordered by already.
        _, newer, older = QUEUE_AGES[filters.age]
        now = timezone.now()
        if newer is not None:
            rows = rows.filter(updated_at__lte=now - newer)
        if older is not None:
            rows = rows.filter(updated_at__gt=now - older)
    if after is not None:
        at, pk = after
        rows = rows.filter(Q(updated_at__gt=at) | Q(updated_at=at, pk__gt=pk))
    rows = rows.annotate(
        receipt_status=F("dispatch__receipt_status"),
        latest_verdict=Subquery(_latest_evidence().values("verdict")[:1]),
        latest_at=Subquery(_latest_evidence().values("captured_at")[:1]),
        lookup_count=Subquery(
            LookupAttempt.objects.filter(operation=OuterRef("pk"))
            .order_by()
            .values("operation")
            .annotate(n=Count("pk"))
            .values("n")[:1]
        ),
        claimed_by=Subquery(
            OperationClaim.objects.filter(
                operation=OuterRef("pk"), touched_at__gt=claim_cutoff()
            ).values("actor")[:1]
        ),
        reason=Case(
            When(~Q(state__in=QUEUE_STATES), then=Value(QUEUE_STRANDED)),
            default=Subquery(
                AuditEvent.objects.filter(operation_key=OuterRef("key"), kind=AuditKind.TRANSITION)
                .order_by("-seq")
                .annotate(code=_REASON_OF_TRANSITION)
                .values("code")[:1]
            ),
        ),
    )
    if filters.verdict == "none":
        rows = rows.filter(latest_verdict__isnull=True)
    elif filters.verdict:
        rows = rows.filter(latest_verdict=filters.verdict)
    if filters.reason:
        rows = rows.filter(reason=filters.reason)
    return rows.select_related("provider").order_by("updated_at", "pk")


def operations_queue_for_user(
    *, user: Any, filters: QueueFilters, after: tuple[datetime, int] | None, limit: int
) -> QueuePage:
    """The console's queue: what waits for an operator, oldest first, one page of it.

    Every operation in ``unknown`` or ``reconcile`` and every stranded receipt (still
    ``running`` on an operation no longer ``dispatched``), of the providers ``user`` may
    view. Each state and the stranded receipts are read by a query of their own, each
    along a partial index (``operation_unsettled``, ``receipt_running``), and merged
    here: one OR across the join would use neither. Keyset pagination on
    (``updated_at``, id), the time the operation entered its state: no OFFSET, no
    COUNT, the same cost on every page.
    """
    visible = providers_visible_to(user=user)
    states = [filters.state] if filters.state in QUEUE_STATES else list(QUEUE_STATES)
    branches = []
    # Only the stranded branch's settled rows wait for the stranded reason, and only
    # they: a branch that cannot hold the reason asked for is not read at all.
    if filters.state != QUEUE_STRANDED and filters.reason != QUEUE_STRANDED:
        # One query per state: with the state fixed, ``operation_unsettled`` yields rows
        # already in (updated_at, id) order and the LIMIT stops the scan; ``state IN``
        # would sort the whole queue first.
        branches += [Operation.objects.filter(state=s, provider__in=visible) for s in states]
    settled_only = not filters.state  # the stranded branch holds no unsettled row then
    if filters.state in ("", QUEUE_STRANDED) and not (
        settled_only and filters.reason not in ("", QUEUE_STRANDED)
    ):
        stranded = Operation.objects.filter(
            provider__in=visible, dispatch__receipt_status=Dispatch.ReceiptStatus.RUNNING
        ).exclude(state=State.DISPATCHED)
        if settled_only:  # the unsettled ones are in the first branches
            stranded = stranded.exclude(state__in=QUEUE_STATES)
        branches.append(stranded)
    rows: list[Operation] = []
    for branch in branches:
        rows.extend(_queue_branch(branch, filters, after)[: limit + 1])
    rows.sort(key=lambda row: (row.updated_at, row.pk))
    if len(rows) <= limit:
        return QueuePage(rows, None)
    last = rows[limit - 1]
    return QueuePage(rows[:limit], (last.updated_at, last.pk))


def operations_queue_counts_for_user(*, user: Any) -> dict[str, int]:
    """How many operations wait in each queue state, and how many receipts are stranded.

    One grouped query over the unsettled rows of the visible providers (from the
    ``operation_provider_state`` index alone), one count over the running receipts.
    """
    # The ids first: given them as values, the planner knows how few providers it is
    # counting for and reads only the index (a subquery made it read the whole queue).
    visible = list(providers_visible_to(user=user).values_list("pk", flat=True))
    counts = {str(state): 0 for state in QUEUE_STATES}
    grouped = (
        Operation.objects.filter(state__in=QUEUE_STATES, provider__in=visible)
        .values("state")
        .annotate(n=Count("state"))
        .order_by()
    )
    for line in grouped:
        counts[line["state"]] = line["n"]
    counts[QUEUE_STRANDED] = (
        Dispatch.objects.filter(
            receipt_status=Dispatch.ReceiptStatus.RUNNING, operation__provider__in=visible
        )
        .exclude(operation__state=State.DISPATCHED)
        .count()
    )
    return counts


def operation_for_user(*, user: Any, key: str) -> Operation | None:
    """One operation by key, or None when there is none or ``user`` may not view it."""
    return (
        Operation.objects.filter(key=key, provider__in=providers_visible_to(user=user))
        .select_related("provider", "host")
        .first()
    )


# -- four-eyes reconciliation requests -------------------------------------------------


@dataclass(frozen=True)
class ProposalRow:
    """A pending proposal with its operation and the operation's latest evidence."""

    request: ReconciliationRequest
    operation: Operation
    evidence: Evidence | None

    @property
    def changed(self) -> bool:
        """The operation or its evidence moved on since the proposal (approving fails)."""
        seen = self.evidence.pk if self.evidence is not None else None
        return (
            self.operation.version != self.request.operation_version
            or seen != self.request.evidence_seen
        )


RECONCILIATIONS_SHOWN = 200


def reconciliation_requests_for_user(*, user: Any) -> list[ProposalRow]:
    """Pending proposals of the providers ``user`` may view, oldest first.

    Bounded: the oldest ``RECONCILIATIONS_SHOWN``; a queue of proposals is short by
    nature (each waits for one approval), and the oldest are the ones to act on.
    """
    names = providers_visible_to(user=user).values("name")
    requests = list(
        ReconciliationRequest.objects.filter(
            status=ReconciliationRequest.Status.PENDING, provider__in=names
        ).order_by("proposed_at", "id")[:RECONCILIATIONS_SHOWN]
    )
    operations = {
        operation.key: operation
        for operation in Operation.objects.filter(key__in=[r.operation_key for r in requests])
        .select_related("provider")
        .annotate(latest_evidence=Subquery(_latest_evidence().values("pk")[:1]))
    }
    latest = Evidence.objects.in_bulk(
        [o.latest_evidence for o in operations.values() if o.latest_evidence]
    )
    rows = []
    for request in requests:
        operation = operations.get(request.operation_key)
        if operation is not None:
            evidence = latest.get(operation.latest_evidence)
            rows.append(ProposalRow(request, operation, evidence))
    return rows


def reconciliation_request_for_user(
    *, user: Any, request_id: int
) -> tuple[ReconciliationRequest, Operation] | None:
    """One request and its operation, or None when absent or ``user`` may not view it."""
    request = ReconciliationRequest.objects.filter(pk=request_id).first()
    if request is None:
        return None
    operation = operation_for_user(user=user, key=request.operation_key)
    if operation is None:
        return None
    return request, operation


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


def operation_jump_for_user(*, user: Any, text: str) -> str | None:
    """The key of the one operation ``text`` names exactly, among those ``user`` may view.

    Names: the operation's key, its permit's or approval's id, or a provider reference
    (the evidence's or the receipt's) that belongs to exactly one visible operation —
    a reference two operations share names neither. Hidden operations are never named,
    so a jump cannot tell an outsider that an id exists.
    """
    if not text or "\x00" in text or len(text) > 200:
        return None
    visible = Operation.objects.filter(provider__in=providers_visible_to(user=user))
    if visible.filter(key=text).exists():
        return text
    try:
        ident = uuid.UUID(text)
    except ValueError:
        ident = None
    if ident is not None:
        bound = [
            *Permit.objects.filter(pk=ident).values_list("operation_key", flat=True),
            *Approval.objects.filter(pk=ident).values_list("operation_key", flat=True),
        ]
        for key in bound:
            if visible.filter(key=key).exists():
                return str(key)
        return None
    named = visible.filter(
        Q(pk__in=Evidence.objects.filter(provider_reference=text).values("operation"))
        | Q(dispatch__receipt_reference=text)
    ).values_list("key", flat=True)[:2]
    keys = list(named)
    return keys[0] if len(keys) == 1 else None


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


def audit_supervisor(*, user: Any) -> bool:
    """Whether ``user`` may read the system chain: credential, provider and grant events.

    A supervisor is a superuser, or a user who holds the supervisor role's own
    permission (``approve_reconciliations``) on at least one provider. The system chain
    is not per provider (a host token serves every provider), so any supervisor reads
    all of it; viewers and operators read only their providers' operation chains.
    """
    if user.is_superuser:
        return True
    supervising = (ProviderPermission.APPROVE_RECONCILIATIONS,)
    return providers_for_user(user=user, permissions=supervising).exists()


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
