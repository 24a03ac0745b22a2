"""The console's queue: what waits for an operator — its filters, pages and counts.

Operations in ``unknown`` or ``reconcile`` and stranded receipts, of the providers the
user may view, each read along a partial index of its own and merged here. When a claim
lapses is here too: the queue shows who holds a live one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from audit.kinds import AuditKind
from common.actors import Actor
from dbsql.rows import values_from_rows
from recovery.models import (
    RECEIPT_MAY_RUN_STATES,
    UNSETTLED_STATES,
    Dispatch,
    Evidence,
    Operation,
    OperationClaim,
    Provider,
    State,
    claim_cutoff,
    receipt_running_sql,
    receipt_stranded,
)
from recovery.selectors.access import providers_visible_to
from recovery.vocabulary import WaitReason

QUEUE_STRANDED = WaitReason.STRANDED
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


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One operation as the queue lists it: what its row shows, read by the page's one
    statement (not an ``Operation``: no model is built, and no column the page does not
    show is read)."""

    pk: int
    key: str
    version: int
    action: str
    provider: str  # its name
    state: str
    receipt_status: str | None  # its dispatch's receipt's status
    updated_at: datetime  # when it entered its state: how long it has waited
    latest_verdict: str | None  # the latest evidence's verdict; None before any lookup
    latest_at: datetime | None  # when that evidence was captured
    lookup_count: int
    claimed_by: Actor | None  # who holds a live claim on it
    reason: str  # why it waits: a key of QUEUE_REASONS, or the transition's own event

    @property
    def receipt_stranded(self) -> bool:
        return receipt_stranded(state=self.state, receipt_status=self.receipt_status)


@dataclass(frozen=True)
class QueuePage:
    rows: list[QueueRow]
    next_after: tuple[datetime, int] | None  # the keyset cursor of the next page
    counts: dict[str, int] | None = None  # when asked for: operations_queue_counts_for_user


@dataclass(frozen=True)
class QueueBranch:
    """One disjoint part of the queue: conditions over ``o`` (a row of the operations
    table) that one partial index serves, and their parameters.

    ``checks``: conditions asked of each row that scan yields (a subquery per row), with
    ``check_params``; ``condition`` is both together. ``prefix``: the WITH clause a
    statement over it starts with (``queue_statement``), naming the providers its user
    may view, with ``prefix_params``; empty when the user may view every provider.
    """

    where: str
    params: tuple[Any, ...]
    prefix: str = ""
    prefix_params: tuple[Any, ...] = ()
    checks: str = ""
    check_params: tuple[Any, ...] = ()

    def narrowed(self, condition: str, *params: Any) -> QueueBranch:
        return replace(self, where=f"{self.where} AND {condition}", params=(*self.params, *params))

    def checked(self, condition: str, *params: Any) -> QueueBranch:
        checks = f"{self.checks} AND {condition}" if self.checks else condition
        return replace(self, checks=checks, check_params=(*self.check_params, *params))

    @property
    def condition(self) -> str:
        """``where`` and ``checks``, the checks written so that the planner expects nearly
        every row to pass them: it cannot know how many do, and its own guess (one in
        200) made it read a branch's every row along another index and sort them all
        before the LIMIT, where reading the index in order stops at the LIMIT (and
        costs no more when few rows pass)."""
        if not self.checks:
            return self.where
        return f"{self.where} AND (CASE WHEN {self.checks} THEN 1 END) IS NOT NULL"

    @property
    def condition_params(self) -> tuple[Any, ...]:
        return (*self.params, *self.check_params)


def queue_statement(branch: QueueBranch, sql: str, params: Sequence[Any]) -> tuple[str, list[Any]]:
    """``sql`` (over the conditions of ``branch``, or of branches of the same user) with
    the WITH clause they name, and its parameters before ``params``."""
    return branch.prefix + sql, [*branch.prefix_params, *params]


# The queue's statements are written out here rather than built by the ORM: compiling
# the annotated querysets of three branches cost a request more than PostgreSQL spent
# running them (docs/benchmarks.md). Each text depends only on which filters
# are set, never on their values, so it is the same text on every call and psycopg
# prepares it. States, kinds and receipt statuses are written into the text, not sent
# as parameters: a prepared statement's generic plan can then still prove that a
# partial index (``state IN ('unknown', 'reconcile')``) covers its rows.
_UNSETTLED = "(" + ", ".join(f"'{state.value}'" for state in UNSETTLED_STATES) + ")"
_NOT_STRANDED = "(" + ", ".join(f"'{state.value}'" for state in RECEIPT_MAY_RUN_STATES) + ")"

_RECEIPT_RUNNING = receipt_running_sql("o")


def _latest_evidence(column: str) -> str:
    return (
        f"(SELECT e.{column} FROM recovery_evidence e WHERE e.operation_id = o.id"
        " ORDER BY e.captured_at DESC, e.id DESC LIMIT 1)"
    )


# Why an operation waits (a QUEUE_REASONS key), read from its last transition: what the
# services write in its data; otherwise the event's own name. A stranded receipt of a
# settled operation waits for the receipt alone.
_REASON = (
    f"CASE WHEN o.state NOT IN {_UNSETTLED} THEN '{QUEUE_STRANDED.value}' ELSE ("
    "SELECT CASE"
    f" WHEN a.data ->> 'reason' = '{WaitReason.LOOKUP_BUDGET_SPENT.value}'"
    f" THEN '{WaitReason.LOOKUP_BUDGET_SPENT.value}'"
    " WHEN a.data ->> 'event' = 'escalate' AND a.data ->> 'verdict' IN"
    f" ('{WaitReason.MISMATCH.value}', '{WaitReason.CORRUPT.value}') THEN a.data ->> 'verdict'"
    f" WHEN a.data ->> 'event' = '{WaitReason.CONFLICT.value}' THEN '{WaitReason.CONFLICT.value}'"
    f" WHEN a.data ->> 'event' = '{WaitReason.LEASE_LOST.value}'"
    f" THEN '{WaitReason.LEASE_LOST.value}'"
    " ELSE a.data ->> 'event' END"
    " FROM audit_auditevent a"
    f" WHERE a.kind = '{AuditKind.TRANSITION.value}' AND a.operation_key = o.key"
    " ORDER BY a.seq DESC LIMIT 1) END"
)

# A page: what each row shows, beside the operation's own columns, read for the page's
# rows alone ({page}: their ids), each along an index of its own. The first parameter
# is when a claim lapses; the page's follow.
_PAGE_SQL = (
    "SELECT o.id, o.key, o.version, o.action, p.name AS provider, o.state, d.receipt_status,"
    f" o.updated_at, {_latest_evidence('verdict')} AS latest_verdict,"
    f" {_latest_evidence('captured_at')} AS latest_at,"
    " (SELECT COUNT(*) FROM recovery_lookupattempt l WHERE l.operation_id = o.id)"
    " AS lookup_count,"
    " (SELECT c.actor FROM recovery_operationclaim c"
    " WHERE c.operation_id = o.id AND c.touched_at > %s) AS claimed_by,"
    f" {_REASON} AS reason"
    " FROM ({page}) page"
    " JOIN recovery_operation o ON o.id = page.id"
    " JOIN recovery_provider p ON p.id = o.provider_id"
    " LEFT JOIN recovery_dispatch d ON d.operation_id = o.id"
    " ORDER BY o.updated_at, o.id"
)
# Each column of ``_PAGE_SQL`` converted as the ORM converts this field's.
_PAGE_FIELDS = tuple(
    cast("Field[Any, Any]", model._meta.get_field(name))
    for model, name in (
        (Operation, "id"),
        (Operation, "key"),
        (Operation, "version"),
        (Operation, "action"),
        (Provider, "name"),
        (Operation, "state"),
        (Dispatch, "receipt_status"),
        (Operation, "updated_at"),
        (Evidence, "verdict"),
        (Evidence, "captured_at"),
        (Operation, "version"),  # the count of lookups: an integer, as it comes
        (OperationClaim, "actor"),
        (Operation, "state"),  # the reason: text, as it comes
    )
)


def _time(value: datetime) -> Any:
    """A datetime as a parameter, as the ORM sends one (SQLite: naive UTC text)."""
    return connection.ops.adapt_datetimefield_value(value)


def queue_branch_filtered(
    branch: QueueBranch, filters: QueueFilters, *, until: datetime | None = None
) -> QueueBranch:
    """``branch`` narrowed to what ``filters`` ask for, and to what entered its state by
    ``until`` if given. The queue pages through these; bulk work counts them."""
    if filters.provider:
        branch = branch.narrowed(
            "o.provider_id IN (SELECT pn.id FROM recovery_provider pn WHERE pn.name = %s)",
            filters.provider,
        )
    if filters.search:  # a prefix, so that the key's own index can serve it
        # The backend's own LIKE (SQLite's needs its ESCAPE), as ``key__startswith`` has.
        like = connection.operators["startswith"] % "%s"  # type: ignore[attr-defined]
        branch = branch.narrowed(
            f"o.key {like}", connection.ops.prep_for_like_query(filters.search) + "%"
        )
    if filters.age in QUEUE_AGES:
        # A range of updated_at, which the queue's index is ordered by already.
        _, newer, older = QUEUE_AGES[filters.age]
        now = timezone.now()
        if newer is not None:
            branch = branch.narrowed("o.updated_at <= %s", _time(now - newer))
        if older is not None:
            branch = branch.narrowed("o.updated_at > %s", _time(now - older))
    if until is not None:
        branch = branch.narrowed("o.updated_at <= %s", _time(until))
    if filters.verdict == "none":
        branch = branch.checked(f"{_latest_evidence('verdict')} IS NULL")
    elif filters.verdict:
        branch = branch.checked(f"{_latest_evidence('verdict')} = %s", filters.verdict)
    if filters.reason:
        branch = branch.checked(f"({_REASON}) = %s", filters.reason)
    return branch


def _visible(user: Any) -> QueueBranch:
    """The providers ``user`` may view, as a condition over ``o``.

    Every provider (a superuser's): no condition at all, since every operation has a
    provider. The page's statement names this condition in each of its eight parts:
    even as a plain list of every provider, planning eight semi-joins was half of its
    planning time.
    """
    visible = providers_visible_to(user=user).values("pk")
    if not visible.query.where:
        return QueueBranch("1 = 1", ())
    # Read once by the statement, as a WITH clause: written out in each part, the
    # object permissions' subquery was planned eight times.
    sql, params = visible.query.sql_with_params()
    return QueueBranch(
        "o.provider_id IN (SELECT pk FROM visible_providers)",
        (),
        f"WITH visible_providers AS ({sql}) ",
        tuple(params),
    )


def _state_branch(visible: QueueBranch, state: str) -> QueueBranch:
    # With the state fixed, ``operation_unsettled`` yields rows already in (updated_at,
    # id) order and a LIMIT stops the scan; ``state IN`` would sort the whole queue first.
    return replace(visible, where=f"o.state = '{State(state).value}'", params=()).narrowed(
        visible.where, *visible.params
    )


def _settled_stranded_branch(visible: QueueBranch) -> QueueBranch:
    # Along ``operation_stranded``: ``receipt_running`` marks the few settled operations
    # that may have a running receipt; the receipt decides.
    return (
        replace(visible, where=f"o.receipt_running AND o.state NOT IN {_NOT_STRANDED}", params=())
        .narrowed(visible.where, *visible.params)
        .checked(_RECEIPT_RUNNING)
    )


def queue_branches_for_user(*, user: Any, filters: QueueFilters) -> list[QueueBranch]:
    """The queue's disjoint parts that can hold what ``filters`` asks for, unfiltered.

    Each state, and the stranded receipts of settled operations, is a query of its own
    along a partial index (``operation_unsettled``, ``operation_stranded``): one OR
    across them would use neither. The queue pages through them; bulk work counts them
    (``queue_branch_filtered`` narrows each to the filters).
    """
    return _branches(_visible(user), filters)


def _branches(visible: QueueBranch, filters: QueueFilters) -> list[QueueBranch]:
    states = [filters.state] if filters.state in UNSETTLED_STATES else list(UNSETTLED_STATES)
    branches = []
    # Only the stranded branch's settled rows wait for the stranded reason, and only
    # they: a branch that cannot hold the reason asked for is not read at all.
    if filters.state != QUEUE_STRANDED and filters.reason != QUEUE_STRANDED:
        branches += [_state_branch(visible, s) for s in states]
    elif filters.state == QUEUE_STRANDED:
        # The stranded receipts of unsettled operations, along the same index.
        branches += [_state_branch(visible, s).checked(_RECEIPT_RUNNING) for s in UNSETTLED_STATES]
    if filters.state in ("", QUEUE_STRANDED) and filters.reason in ("", QUEUE_STRANDED):
        branches.append(_settled_stranded_branch(visible))
    return branches


def _page_sql(
    visible: QueueBranch, filters: QueueFilters, after: tuple[datetime, int] | None, limit: int
) -> tuple[str, list[Any]] | None:
    """The statement of one page (``limit`` + 1 rows), or None when no branch can hold
    what ``filters`` ask for."""
    parts: list[str] = []
    params: list[Any] = [_time(claim_cutoff())]
    for number, branch in enumerate(_branches(visible, filters)):
        branch = queue_branch_filtered(branch, filters)
        if after is not None:
            # A row comparison, in the index's own order: the scan starts at the cursor.
            branch = branch.narrowed("(o.updated_at, o.id) > (%s, %s)", _time(after[0]), after[1])
        parts.append(
            "SELECT * FROM (SELECT o.id, o.updated_at FROM recovery_operation o"
            f" WHERE {branch.condition} ORDER BY o.updated_at, o.id LIMIT {limit + 1}) b{number}"
        )
        params += branch.condition_params
    if not parts:
        return None
    page = (
        f"SELECT id, updated_at FROM ({' UNION ALL '.join(parts)}) branches"
        f" ORDER BY updated_at, id LIMIT {limit + 1}"
    )
    return _PAGE_SQL.replace("{page}", page), params


def capped_count_sql(branch: QueueBranch, cap: int, name: str) -> str:
    """A subquery counting the operations of ``branch`` up to ``cap`` + 1: its LIMIT stops
    the scan there, so it costs the same however many there are past it."""
    return (
        f"(SELECT COUNT(*) FROM (SELECT 1 FROM recovery_operation o WHERE {branch.condition}"
        f" LIMIT {int(cap) + 1}) {name})"
    )


def _counts_sql(visible: QueueBranch) -> tuple[str, list[Any]]:
    """One row: how many wait in ``unknown``, in ``reconcile``, and stranded receipts,
    each counted to ``QUEUE_COUNT_CAP`` + 1.

    No count has an ORDER BY: a count needs no order, and given one the planner may read
    every row of a branch along another index and sort them all before the LIMIT (it
    cannot know how many receipts are running). Unordered, each part is a scan of a
    partial index whose predicate is the part's own condition, stopped by the LIMIT.
    """
    selects: list[str] = []
    params: list[Any] = []
    for state in UNSETTLED_STATES:
        branch = _state_branch(visible, state)
        count = capped_count_sql(branch, QUEUE_COUNT_CAP, f"capped_{state.value}")
        selects.append(f"{count} AS count_{state.value}")
        params += branch.condition_params
    # The stranded receipts in three parts (those of each unsettled state, and of the
    # settled operations ``operation_stranded`` marks) under one LIMIT: each receipt is
    # asked about row by row, and once the cap is reached no further part is read.
    stranded = [
        *(_state_branch(visible, state).checked(_RECEIPT_RUNNING) for state in UNSETTLED_STATES),
        _settled_stranded_branch(visible),
    ]
    parts = [f"SELECT 1 FROM recovery_operation o WHERE {branch.condition}" for branch in stranded]
    selects.append(
        f"(SELECT COUNT(*) FROM ({' UNION ALL '.join(parts)} LIMIT {QUEUE_COUNT_CAP + 1})"
        " stranded) AS count_stranded"
    )
    params += [param for branch in stranded for param in branch.condition_params]
    return "SELECT " + ", ".join(selects), params


_COUNT_NAMES = (*(str(state) for state in UNSETTLED_STATES), str(QUEUE_STRANDED))


def operations_queue_for_user(
    *,
    user: Any,
    filters: QueueFilters,
    after: tuple[datetime, int] | None,
    limit: int,
    counted: bool = False,
) -> QueuePage:
    """The console's queue: what waits for an operator, oldest first, one page of it.

    Every operation in ``unknown`` or ``reconcile`` and every stranded receipt (still
    ``running`` on an operation no longer ``dispatched``), of the providers ``user`` may
    view. Each state and the stranded receipts of settled operations are read along a
    partial index of their own (``operation_unsettled``, ``operation_stranded``), each
    stopped by its LIMIT, and merged by the same one statement, which then reads what
    the page shows for the page's rows alone. Keyset pagination on (``updated_at``,
    id), the time the operation entered its state: no OFFSET, no COUNT, the same cost
    on every page.

    ``counted``: the page's ``counts`` too (``operations_queue_counts_for_user``), read
    by the same statement: the page's rows joined to the one row of counts.
    """
    visible = _visible(user)
    page = _page_sql(visible, filters, after, limit)
    counts: dict[str, int] | None = None
    if counted:
        counts_sql, params = _counts_sql(visible)
        if page is not None:
            counts_sql = (
                f"SELECT * FROM ({counts_sql}) counts LEFT JOIN ({page[0]}) page_rows ON 1 = 1"
                " ORDER BY page_rows.updated_at, page_rows.id"
            )
            params += page[1]
        with connection.cursor() as cursor:
            cursor.execute(*queue_statement(visible, counts_sql, params))
            found = cursor.fetchall()
        width = len(_COUNT_NAMES)
        counts = {name: int(n) for name, n in zip(_COUNT_NAMES, found[0][:width], strict=True)}
        # With no row on the page, the one row of counts has nothing (NULLs) joined to it.
        found = [row[width:] for row in found if len(row) > width and row[width] is not None]
    elif page is not None:
        with connection.cursor() as cursor:
            cursor.execute(*queue_statement(visible, *page))
            found = cursor.fetchall()
    else:
        found = []
    rows = [QueueRow(*values) for values in values_from_rows(_PAGE_FIELDS, found)]
    if len(rows) <= limit:
        return QueuePage(rows, None, counts)
    last = rows[limit - 1]
    return QueuePage(rows[:limit], (last.updated_at, last.pk), counts)


def operations_queue_counts_for_user(*, user: Any) -> dict[str, int]:
    """How many operations wait in each queue state, and how many receipts are stranded.

    Counted up to ``QUEUE_COUNT_CAP``: past it the count is ``QUEUE_COUNT_CAP + 1``,
    which the console shows as "1,000+". Each count reads at most that many index
    entries (a LIMITed subquery), so the page costs the same with a hundred thousand
    stuck operations as with a thousand; all three in one statement (the queue's page
    reads them with its rows: ``operations_queue_for_user(counted=True)``).
    """
    visible = _visible(user)
    with connection.cursor() as cursor:
        cursor.execute(*queue_statement(visible, *_counts_sql(visible)))
        row = cursor.fetchone()
    return {name: int(n) for name, n in zip(_COUNT_NAMES, row, strict=True)}
