"""Background recovery: the sweep, and the lookups it queues for Celery workers.

Nobody has to call ``resume`` for a dead worker's operation to settle. Beat runs
``sweep`` every few seconds (``SETTLE_SWEEP_SECONDS``); it does two things, each in
batches of ``SETTLE_SWEEP_BATCH`` rows per transaction:

lapsed leases
    Operations still ``dispatched`` whose receipt is ``running`` and whose dispatch lease
    (renewed by heartbeats, the provider's ``lease_seconds`` long) has lapsed by the
    database's clock → ``unknown`` (``lease_lost``, as ``resume`` does), and its first
    lookup queued at once, in the same transaction (as below).
due lookups
    ``unknown`` operations whose ``next_lookup_at`` is due and that have no lookup in
    flight → a ``queued`` lookup attempt, claimed with ``lookups_queue`` (the claim resume
    makes, for a batch), then published after the commit: beat's sweep sends one
    ``lookup_batch`` task per provider and ``SETTLE_LOOKUP_BATCH`` attempts.

Rows are taken with ``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL, so sweepers on
several machines, and host calls holding an operation, never wait on each other and
never handle one row twice; on SQLite writers are serialised anyway.

The schedule lives in rows, not in messages: a crash between a commit and a publish,
a lost message or a broker that is down strands nothing. A queued attempt that no
worker started within ``SETTLE_LOOKUP_QUEUE_SECONDS``, or a running one whose worker
died (its lease lapsed), is abandoned by the next sweep and queued afresh.

What a worker does with the attempts the sweep queued is ``lookup_tasks``'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from audit.chain import audit_chain_locked, audit_transaction
from common.actors import Actor
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    Dispatch,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.dispatch import lease_lapsed_change
from recovery.services.locking import locking
from recovery.services.lookups import SWEEPER_ACTOR, lookups_queue
from recovery.transitions import operation_transition_many

logger = logging.getLogger(__name__)


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
    moved, _ = _leases_lapse(batch_size=batch_size, actor=actor, queue=False)
    return moved


def _leases_lapse(
    *, batch_size: int, actor: Actor, queue: bool
) -> tuple[list[int], list[tuple[int, int]]]:
    """``leases_sweep``; with ``queue``, each moved operation's first lookup queued too.

    In the same transaction, under the same locks, as resume claims its lookup with the
    lease-lost transition: the lookup is due at once, and finding the operation again
    later would cost the sweep a second query and lock per batch. Returns the moved
    operations' ids and (attempt id, provider id) of the attempts queued.
    """
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
            return [], []
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
        lapsed = []
        for operation in operations:
            dispatch = dispatches.get(operation.pk)
            if dispatch is not None:
                lapsed.append(lease_lapsed_change(audit_chain_locked(operation), dispatch))
        # One compare-and-set statement for the batch, each row checked on its own: a
        # refused row wrote nothing and took back its event, so it fails only itself.
        refused = operation_transition_many(changes=lapsed, actor=actor)
        for exc in refused:
            logger.error("sweep: %s", exc)
        gone = {exc.operation_key for exc in refused}
        moved = [change.operation for change in lapsed if change.operation.key not in gone]
        attempts = lookups_queue(operations=moved, actor=actor) if queue else []
    return [operation.pk for operation in moved], [
        (attempt.pk, attempt.operation.provider_id) for attempt in attempts
    ]


def _lookups_queue(*, batch_size: int, actor: Actor) -> list[tuple[int, int]]:
    """One batch: due ``unknown`` operations with no live lookup → queued attempts, as
    (attempt id, provider id)."""
    now = timezone.now()
    live = LookupAttempt.objects.filter(
        operation=OuterRef("pk"), status__in=LOOKUP_IN_FLIGHT, lease_expires_at__gt=now
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
        for operation in operations:
            audit_chain_locked(operation)
        attempts = lookups_queue(operations=operations, actor=actor)
    return [(attempt.pk, attempt.operation.provider_id) for attempt in attempts]


def sweep(
    *,
    publish: Callable[[int], object] | None = None,
    publish_batch: Callable[[list[int]], object] | None = None,
    batch_size: int = 0,
    max_batches: int = 10,
    actor: Actor = SWEEPER_ACTOR,
) -> SweepReport:
    """Lapsed leases to ``unknown``, then due lookups queued and published, batch by batch.

    An operation whose lease lapsed has its first lookup queued in the same transaction
    (``_leases_lapse``), published as soon as that batch committed; then every other
    due operation's. ``publish(attempt_id)`` sends the task that runs one attempt;
    ``publish_batch(ids)`` (beat's sweep) one that runs a batch of attempts of one
    provider, at most ``SETTLE_LOOKUP_BATCH`` of them. Either is called after the
    attempts' rows committed, never inside a transaction. A publish that fails (the
    broker is down) ends the publishing and the queueing — leases still lapse: the
    attempts stay queued in the database and a later sweep queues them again once their
    lease lapses. Call it outside a transaction.
    """
    assert (publish is None) != (publish_batch is None), "publish one way"
    batch_size = batch_size or settings.SETTLE_SWEEP_BATCH
    report = SweepReport()
    for _ in range(max_batches):
        moved, queued = _leases_lapse(
            batch_size=batch_size, actor=actor, queue=not report.publish_failed
        )
        report.leases_lapsed += moved
        _publish(report, queued, publish, publish_batch)
        if len(moved) < batch_size:
            break
    for _ in range(max_batches):
        if report.publish_failed:
            break
        queued = _lookups_queue(batch_size=batch_size, actor=actor)
        _publish(report, queued, publish, publish_batch)
        if len(queued) < batch_size:
            break
    return report


def _publish(
    report: SweepReport,
    queued: list[tuple[int, int]],
    publish: Callable[[int], object] | None,
    publish_batch: Callable[[list[int]], object] | None,
) -> None:
    """Publish the attempts just queued (committed), unless a publish failed already."""
    report.lookups_queued += [attempt_id for attempt_id, _ in queued]
    for message in _messages(queued, batched=publish_batch is not None):
        if report.publish_failed:
            break
        try:
            if publish_batch is not None:
                publish_batch(message)
            else:
                assert publish is not None
                publish(message[0])
        except Exception as exc:  # the broker's errors vary by transport
            logger.warning("sweep: publishing lookups %s failed: %r", message, exc)
            report.publish_failed = True
        else:
            report.published += len(message)


def _messages(queued: list[tuple[int, int]], *, batched: bool) -> list[list[int]]:
    """The attempt ids of each message: one each, or batches of one provider's."""
    if not batched:
        return [[attempt_id] for attempt_id, _ in queued]
    by_provider: dict[int, list[int]] = {}
    for attempt_id, provider_id in queued:
        by_provider.setdefault(provider_id, []).append(attempt_id)
    size = settings.SETTLE_LOOKUP_BATCH
    return [
        ids[start : start + size]
        for ids in by_provider.values()
        for start in range(0, len(ids), size)
    ]
