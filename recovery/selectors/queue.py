"""The console's queue: what waits for an operator — its filters, pages, counts and jump.

Operations in ``unknown`` or ``reconcile`` and stranded receipts, of the providers the
user may view, each read along a partial index of its own and merged here. When a claim
lapses is here too: the queue shows who holds a live one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.utils import timezone

from approvals.models import Approval, Permit
from recovery.models import (
    AuditEvent,
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    OperationClaim,
    State,
)
from recovery.selectors.access import providers_visible_to
from recovery.vocabulary import AuditKind, WaitReason

QUEUE_STRANDED = WaitReason.STRANDED
QUEUE_STATES = (State.UNKNOWN, State.RECONCILE)
# The queue's counts stop here. Exact below it, where a number tells an operator
# something ("3 waiting"); past it "1,000+" says as much, and a count that read every
# stuck row on every page view would cost more the worse things get. Not a counts
# table: that would be one hot row written by every transition, and a number an
# operator would have to trust the age of.
QUEUE_COUNT_CAP = 1000

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


def _receipt_running(rows: QuerySet[Operation]) -> QuerySet[Operation]:
    """``rows`` whose dispatch's receipt is still running.

    Asked row by row, from the ``receipt_running`` index alone, not by a join: the
    planner cannot know that nearly every stuck operation's receipt is running, and for
    a join it hashes every running receipt before returning the first row.
    """
    running = Dispatch.objects.filter(
        operation=OuterRef("pk"), receipt_status=Dispatch.ReceiptStatus.RUNNING
    ).values("operation")[:1]
    return rows.alias(running=Subquery(running)).filter(running=F("pk"))


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


def queue_branches_for_user(*, user: Any, filters: QueueFilters) -> list[QuerySet[Operation]]:
    """The queue's disjoint parts that can hold what ``filters`` asks for, unfiltered.

    Each state, and the stranded receipts of settled operations, is a query of its own
    along a partial index (``operation_unsettled``, ``operation_stranded``): one OR
    across them would use neither. The queue pages through them; bulk work counts them.
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
    elif filters.state == QUEUE_STRANDED:
        # The stranded receipts of unsettled operations, along the same index.
        branches += [
            _receipt_running(Operation.objects.filter(state=s, provider__in=visible))
            for s in QUEUE_STATES
        ]
    if filters.state in ("", QUEUE_STRANDED) and filters.reason in ("", QUEUE_STRANDED):
        # Settled operations with a running receipt, along ``operation_stranded``
        # (``receipt_running`` marks the few that may have one; the receipt decides).
        branches.append(
            _receipt_running(
                Operation.objects.filter(provider__in=visible, receipt_running=True).exclude(
                    state__in=[State.DISPATCHED, *QUEUE_STATES]
                )
            )
        )
    return branches


def operations_queue_for_user(
    *, user: Any, filters: QueueFilters, after: tuple[datetime, int] | None, limit: int
) -> QueuePage:
    """The console's queue: what waits for an operator, oldest first, one page of it.

    Every operation in ``unknown`` or ``reconcile`` and every stranded receipt (still
    ``running`` on an operation no longer ``dispatched``), of the providers ``user`` may
    view. Each state and the stranded receipts of settled operations are read by a
    query of their own, each along a partial index (``operation_unsettled``,
    ``operation_stranded``), and merged here: one OR across them would use neither.
    Keyset pagination on (``updated_at``, id), the time the operation entered its
    state: no OFFSET, no COUNT, the same cost on every page.
    """
    rows: list[Operation] = []
    for branch in queue_branches_for_user(user=user, filters=filters):
        rows.extend(_queue_branch(branch, filters, after)[: limit + 1])
    rows.sort(key=lambda row: (row.updated_at, row.pk))
    if len(rows) <= limit:
        return QueuePage(rows, None)
    last = rows[limit - 1]
    return QueuePage(rows[:limit], (last.updated_at, last.pk))


def operations_queue_counts_for_user(*, user: Any) -> dict[str, int]:
    """How many operations wait in each queue state, and how many receipts are stranded.

    Counted up to ``QUEUE_COUNT_CAP``: past it the count is ``QUEUE_COUNT_CAP + 1``,
    which the console shows as "1,000+". Each count reads at most that many index
    entries (a LIMITed subquery), so the page costs the same with a hundred thousand
    stuck operations as with a thousand; all three in one statement.
    """
    visible = providers_visible_to(user=user)
    # (what it counts toward, rows): each part read along the index its branch of the
    # queue reads, the stranded receipts in three (those of each unsettled state, and
    # of the settled operations ``operation_stranded`` marks).
    parts: list[tuple[str, QuerySet[Any]]] = [
        (str(state), Operation.objects.filter(state=state, provider__in=visible))
        for state in QUEUE_STATES
    ]
    parts += [
        (
            QUEUE_STRANDED,
            _receipt_running(Operation.objects.filter(state=state, provider__in=visible)),
        )
        for state in QUEUE_STATES
    ]
    settled = Operation.objects.filter(provider__in=visible, receipt_running=True)
    parts.append(
        (
            QUEUE_STRANDED,
            _receipt_running(settled.exclude(state__in=[State.DISPATCHED, *QUEUE_STATES])),
        )
    )
    selects: list[str] = []
    params: list[Any] = []
    for number, (_, rows) in enumerate(parts):
        sql, part_params = rows.values("pk")[: QUEUE_COUNT_CAP + 1].query.sql_with_params()
        selects.append(f"(SELECT COUNT(*) FROM ({sql}) capped_{number})")
        params.extend(part_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(selects), params)
        row = cursor.fetchone()
    counts = {str(state): 0 for state in QUEUE_STATES} | {QUEUE_STRANDED: 0}
    for (name, _), n in zip(parts, row, strict=True):
        counts[name] = min(counts[name] + int(n), QUEUE_COUNT_CAP + 1)
    return counts


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
    # Two reads, each along its partial index (``evidence_provider_reference``,
    # ``receipt_reference``): one OR across them would read every operation.
    by_evidence = visible.filter(
        pk__in=Evidence.objects.filter(provider_reference=text).values("operation")
    )
    by_receipt = visible.filter(dispatch__receipt_reference=text)
    named = {
        *by_evidence.values_list("key", flat=True)[:2],
        *by_receipt.values_list("key", flat=True)[:2],
    }
    return named.pop() if len(named) == 1 else None
