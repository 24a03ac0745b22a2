"""Approvals nobody decided in time: pending past ``expires_at`` → ``expired``.

An approval's ``expires_at`` (set when it opened, by its policy) is when a person's
decision stops being wanted. Beat's sweep task expires what is due, in batches: the
approval becomes ``expired`` (compare-and-set on its status, so one decided meanwhile is
never expired) and its operation moves ``awaiting_approval → expired`` through the one
transition table (``Event.EXPIRE``), with an ``approval_expired`` audit event, all in one
transaction. The change carries the approval's id and the decision, so its recorders
hear of it as of any decision: the hosts' ``approval.decided`` webhook says
``expired``, and resume answers ``closed`` with state ``expired``, as after a denial;
and the approvers told of it are owed an ``expired`` message (``approvals.notices``),
written in the same transaction.

A decision that comes after ``expires_at`` is refused whatever the sweep's lag
(``approvals.services.approvals.approval_resolve`` compares it with the database's clock in its
compare-and-set); it expires the approval there and then, through the same steps
(``approval_expire_at_decision``), so the inbox stops offering it.

Lock order as everywhere (``locking``): the operations first, ``SKIP LOCKED`` — one a
host or an approver holds right now is left to the next sweep, which finds it decided or
still due — then each approval's compare-and-set under its operation's lock.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet

from approvals.models import Approval
from approvals.notices import approval_expired_notices_record
from audit.chain import audit_append, audit_chain_locked, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from dbsql.clock import db_now
from recovery.models import Operation, State
from recovery.services.locking import locking
from recovery.services.lookups import SWEEPER_ACTOR
from recovery.transitions import Change, Event, operation_transition, operation_transition_many

logger = logging.getLogger(__name__)

EXPIRED = Approval.Status.EXPIRED
PENDING = Approval.Status.PENDING


def _skip_locked(operations: QuerySet[Operation]) -> QuerySet[Operation]:
    return locking(operations).select_for_update(of=("self",), no_key=True, skip_locked=True)


def approvals_expire(
    *, now: datetime, limit: int = 0, actor: Actor = SWEEPER_ACTOR
) -> list[uuid.UUID]:
    """One batch of at most ``limit`` due approvals expired, and their operations; their ids.

    Fewer than ``limit`` when some operations were held by others (skipped, not waited
    for) or were decided in the meantime. Call it outside a transaction.
    """
    limit = limit or settings.SETTLE_SWEEP_BATCH
    with audit_transaction():
        due = dict(
            Approval.objects.filter(status=PENDING, expires_at__lte=now)
            .order_by("expires_at", "id")
            .values_list("operation_key", "id")[:limit]
        )
        if not due:
            return []
        operations = [
            audit_chain_locked(operation)
            for operation in _skip_locked(Operation.objects.filter(key__in=list(due))).order_by(
                "id"
            )
        ]
        expired, changes, closed = [], [], []
        for operation in operations:
            approval_id = due[operation.key]
            won, change = _approval_expire(operation, approval_id, now, actor)
            if won:
                expired.append(approval_id)
            if change is not None:
                changes.append(change)
                closed.append(approval_id)
        # The operations are locked and were read under the lock: a refusal here is a
        # bug, and raising takes back the approvals' expiry with it.
        refused = operation_transition_many(changes=changes, actor=actor)
        if refused:
            raise refused[0]
        _notices_owed(closed)
    return expired


def approval_expire_at_decision(*, operation: Operation, approval_id: uuid.UUID) -> bool:
    """Expire one approval found past due by a decision, as the sweep would have.

    A decision that comes after ``expires_at`` is refused whatever the sweep's lag; the
    approval is closed at once (and its operation with it) so that nobody is offered it
    again. The caller holds the operation's lock (``audit_chain_locked``) and its
    transaction, which also records the refusal: both commit together. False if it was
    not pending and due by the database's clock. Settle's expiry has one actor, the
    sweeper's, whichever path found it due.
    """
    won, change = _approval_expire(operation, approval_id, db_now(), SWEEPER_ACTOR)
    if change is not None:
        operation_transition(
            operation=operation, event=change.event, actor=SWEEPER_ACTOR, data=change.data
        )
        _notices_owed([approval_id])
    return won


def _approval_expire(
    operation: Operation, approval_id: uuid.UUID, now: datetime, actor: Actor
) -> tuple[bool, Change | None]:
    """Expire the approval if still pending and due by ``now``, on the operation's
    chain; whether it did, and the operation's transition to make, if any.

    The operation is locked by the caller.
    """
    # Under the operation's lock nobody decides it, yet the status is compared anyway:
    # a decision that committed after the caller's read must win.
    won = Approval.objects.filter(pk=approval_id, status=PENDING, expires_at__lte=now).update(
        status=EXPIRED, decided_by=actor, decided_at=now
    )
    if won != 1:
        return False, None
    audit_append(
        kind=AuditKind.APPROVAL_EXPIRED,
        operation=operation,
        actor=actor,
        data={"approval_id": str(approval_id), "at": now.isoformat()},
    )
    if operation.state != State.AWAITING_APPROVAL:
        # An approval left pending by an operation that moved on without it: closed, on
        # the record, and nothing else moves.
        logger.warning(
            "approval %s of %s expired in %s", approval_id, operation.key, operation.state
        )
        return True, None
    data = {"approval_id": str(approval_id), "decision": EXPIRED.value}
    return True, Change(operation, Event.EXPIRE, data=data)


def _notices_owed(approval_ids: list[uuid.UUID]) -> None:
    """The approvers told of these approvals are owed an ``expired`` notice, in the
    expiry's transaction (``approvals.notices``).

    Only for an expiry that closed its operation: one left pending by an operation that
    moved on without it is no decision anybody still waits for.
    """
    approval_expired_notices_record(approval_ids=approval_ids)


def approvals_expire_due(*, now: datetime, max_batches: int = 10) -> int:
    """Every due approval expired, batch by batch, as beat's sweep task does; how many.

    Stops at the first short batch: what is left was held by others, or is not due.
    """
    limit = settings.SETTLE_SWEEP_BATCH
    count = 0
    for _ in range(max_batches):
        expired = approvals_expire(now=now, limit=limit)
        count += len(expired)
        if len(expired) < limit:
            break
    return count
