"""Background recovery: the sweep, and the lookups it queues for Celery workers.

Nobody has to call ``resume`` for a dead worker's operation to settle. Beat runs
``sweep`` every few seconds (``SETTLE_SWEEP_SECONDS``); it does two things, each in
batches of ``SETTLE_SWEEP_BATCH`` rows per transaction:

lapsed leases
    Operations still ``dispatched`` whose receipt is ``running`` and whose dispatch lease
    (renewed by heartbeats, the provider's ``lease_seconds`` long) has lapsed by the
    database's clock → ``unknown`` (``lease_lost``, as ``resume`` does), first lookup due
    at once.
due lookups
    ``unknown`` operations whose ``next_lookup_at`` is due and that have no lookup in
    flight → a ``queued`` lookup attempt, claimed with ``lookup_claim`` (the claim resume
    makes), then one task published per attempt, after the commit.

Rows are taken with ``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL, so sweepers on
several machines, and host calls holding an operation, never wait on each other and
never handle one row twice; on SQLite writers are serialised anyway.

The schedule lives in rows, not in messages: a crash between a commit and a publish,
a lost message or a broker that is down strands nothing. A queued attempt that no
worker started within ``SETTLE_LOOKUP_QUEUE_SECONDS``, or a running one whose worker
died (its lease lapsed), is abandoned by the next sweep and queued afresh.

``lookup_attempt_run`` is what the task calls: it starts a queued attempt and runs it
with ``lookup_run``, the same code as resume's synchronous lookup. A duplicate or
redelivered message changes nothing: the attempt is no longer queued, or is running
under another worker's live lease (then: retry after that lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Now
from django.utils import timezone

from approvals.actors import Actor
from recovery.audit import audit_chain_locked, audit_transaction
from recovery.models import Dispatch, LookupAttempt, Operation, State
from recovery.services.dispatch import lease_lapsed
from recovery.services.locking import locking
from recovery.services.lookups import (
    IN_FLIGHT,
    lookup_abandon,
    lookup_claim,
    lookup_lease,
    lookup_run,
)
from recovery.transitions import TransitionRefused

logger = logging.getLogger(__name__)

# Who the sweeper and its background lookups are, on the record.
SWEEPER_ACTOR = Actor.system("sweeper")


@dataclass
class SweepReport:
    """What one sweep did: ids of the operations it moved and the attempts it queued."""

    leases_lapsed: list[int] = field(default_factory=list)
    lookups_queued: list[int] = field(default_factory=list)
    published: int = 0
    publish_failed: bool = False


def _skip_locked(operations: QuerySet[Operation]) -> QuerySet[Operation]:
    """``locking(operations)``, skipping rows another transaction holds (PostgreSQL)."""
    return locking(operations).select_for_update(of=("self",), no_key=True, skip_locked=True)


def leases_sweep(*, batch_size: int, actor: Actor = SWEEPER_ACTOR) -> list[int]:
    """One batch: dispatched operations whose lease lapsed → ``unknown``; their ids."""
    with audit_transaction():
        operations = list(
            _skip_locked(
                Operation.objects.filter(
                    state=State.DISPATCHED,
                    dispatch__receipt_status=Dispatch.ReceiptStatus.RUNNING,
                    dispatch__lease_expires_at__lte=Now(),
                )
            ).order_by("id")[:batch_size]
        )
        if not operations:
            return []
        # Read again now that the rows are locked: a heartbeat that committed since the
        # statement above began may have renewed a lease.
        dispatches = {
            dispatch.operation_id: dispatch
            for dispatch in Dispatch.objects.filter(
                operation__in=operations,
                receipt_status=Dispatch.ReceiptStatus.RUNNING,
                lease_expires_at__lte=Now(),
            )
        }
        moved = []
        for operation in operations:
            dispatch = dispatches.get(operation.pk)
            if dispatch is None:
                continue
            audit_chain_locked(operation)
            try:
                with audit_transaction():  # a savepoint: one refusal fails only its row
                    lease_lapsed(operation, dispatch, actor)
            except TransitionRefused as exc:
                logger.error("sweep: %s", exc)
                continue
            moved.append(operation.pk)
    return moved


def lookups_sweep(*, batch_size: int, actor: Actor = SWEEPER_ACTOR) -> list[int]:
    """One batch: due ``unknown`` operations with no live lookup → queued attempts' ids."""
    now = timezone.now()
    live = LookupAttempt.objects.filter(
        operation=OuterRef("pk"), status__in=IN_FLIGHT, lease_expires_at__gt=now
    )
    with audit_transaction():
        operations = list(
            _skip_locked(
                Operation.objects.filter(
                    Q(next_lookup_at__isnull=True) | Q(next_lookup_at__lte=now),
                    state=State.UNKNOWN,
                ).filter(~Exists(live))
            ).order_by("next_lookup_at", "id")[:batch_size]
        )
        queued = []
        for operation in operations:
            audit_chain_locked(operation)
            slot = lookup_claim(
                operation=operation,
                trigger=LookupAttempt.Trigger.TASK,
                actor=actor,
                due_only=True,
                queued=True,
            )
            if slot.attempt is not None:
                queued.append(slot.attempt.pk)
    return queued


def sweep(
    *,
    publish: Callable[[int], object],
    batch_size: int = 0,
    max_batches: int = 10,
    actor: Actor = SWEEPER_ACTOR,
) -> SweepReport:
    """Lapsed leases to ``unknown``, then due lookups queued and published, batch by batch.

    ``publish(attempt_id)`` sends the task that runs one attempt; it is called after the
    attempt's row committed, never inside a transaction. A publish that fails (the
    broker is down) ends the publishing: the attempts stay queued in the database and a
    later sweep queues them again once their lease lapses. Call it outside a transaction.
    """
    batch_size = batch_size or settings.SETTLE_SWEEP_BATCH
    report = SweepReport()
    for _ in range(max_batches):
        moved = leases_sweep(batch_size=batch_size, actor=actor)
        report.leases_lapsed += moved
        if len(moved) < batch_size:
            break
    for _ in range(max_batches):
        queued = lookups_sweep(batch_size=batch_size, actor=actor)
        report.lookups_queued += queued
        for attempt_id in queued:
            if report.publish_failed:
                break
            try:
                publish(attempt_id)
            except Exception as exc:  # the broker's errors vary by transport
                logger.warning("sweep: publishing lookup %s failed: %r", attempt_id, exc)
                report.publish_failed = True
            else:
                report.published += 1
        if len(queued) < batch_size or report.publish_failed:
            break
    return report


# -- the lookup task's service -------------------------------------------------------


@dataclass(frozen=True)
class BackgroundLookup:
    """What running one queued attempt did.

    ``state`` is the operation's state afterwards ("" if the attempt does not exist);
    ``retry_in`` is set when another worker holds the attempt under a live lease.
    """

    looked_up: bool
    state: str = ""
    retry_in: int = 0


def _attempt_begin(attempt_id: int, actor: Actor) -> tuple[LookupAttempt | None, BackgroundLookup]:
    """Start ``attempt_id`` under its operation's lock, if it is still this task's to run.

    A queued attempt starts; a running one whose lease lapsed (its worker died mid-lookup
    and the message was delivered again) is taken over. Anything else is a duplicate.
    """
    with audit_transaction():
        operation_id = LookupAttempt.objects.filter(pk=attempt_id).values("operation_id")[:1]
        operation = locking(Operation.objects.filter(pk=Subquery(operation_id))).first()
        if operation is None:
            return None, BackgroundLookup(False)
        audit_chain_locked(operation)
        attempt = LookupAttempt.objects.select_for_update().get(pk=attempt_id)
        now = timezone.now()
        done = BackgroundLookup(False, operation.state)
        if attempt.status not in IN_FLIGHT:
            return None, done
        if attempt.status == LookupAttempt.Status.RUNNING and attempt.lease_expires_at > now:
            seconds = int((attempt.lease_expires_at - now).total_seconds()) + 1
            return None, BackgroundLookup(False, operation.state, retry_in=seconds)
        if operation.state != State.UNKNOWN:
            # Settled or escalated since it was queued: nothing left for this lookup.
            lookup_abandon(
                operation=operation, attempt=attempt, actor=actor, reason=operation.state
            )
            return None, done
        attempt.status = LookupAttempt.Status.RUNNING
        attempt.started_at = now
        attempt.lease_expires_at = now + lookup_lease(operation.provider)
        attempt.save(update_fields=["status", "started_at", "lease_expires_at"])
        attempt.operation = operation
        return attempt, done


def lookup_attempt_run(*, attempt_id: int, actor: Actor = SWEEPER_ACTOR) -> BackgroundLookup:
    """Run one queued lookup attempt (the Celery task's body); safe to run twice.

    The provider is read outside any transaction; its answer is applied with the
    compare-and-set rules every lookup follows (``lookup_run``).
    """
    attempt, outcome = _attempt_begin(attempt_id, actor)
    if attempt is None:
        return outcome
    return BackgroundLookup(True, lookup_run(attempt=attempt, actor=actor).state)
