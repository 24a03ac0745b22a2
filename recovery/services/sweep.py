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

``lookup_batch_run`` is what the batch task calls: it starts the queued attempts, reads
their provider once and applies the answers in one transaction, each judged by the
rules every lookup follows (``evidence_apply_many``). ``lookup_attempt_run`` runs one
attempt with ``lookup_run``, the same code as ``operation_lookup``. A duplicate or
redelivered message changes nothing: the attempt is no longer queued, or is running
under another worker's live lease (then: retry after that lease).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Now
from django.utils import timezone

from approvals.actors import Actor
from recovery.adapters import LookupResult, evidence_lookup_many
from recovery.audit import audit_chain_locked, audit_transaction
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    UNSETTLED_STATES,
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.dispatch import lease_lapsed_change
from recovery.services.evidence import EvidenceFound, evidence_apply_many
from recovery.services.locking import locking
from recovery.services.lookups import (
    RECONCILE_RECHECK,
    lookup_abandon,
    lookup_lease,
    lookup_run,
    lookups_queue,
)
from recovery.services.providers import provider_config
from recovery.services.signals import stale_signal
from recovery.transitions import operation_transition_many
from recovery.vocabulary import StaleSignal

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


# The states in which a queued attempt still runs, by who queued it: the sweeper's are
# for unknown operations; resume's for unsettled ones (a reconcile is looked at again,
# its record may have been repaired); an operator's in any state, as they asked.
_LOOKED_UP_IN: dict[str, tuple[str, ...]] = {
    LookupAttempt.Trigger.TASK: (State.UNKNOWN,),
    LookupAttempt.Trigger.RESUME: UNSETTLED_STATES,
}


def _attempt_claim(
    operation: Operation, attempt: LookupAttempt, now: Any, actor: Actor
) -> tuple[bool, int]:
    """Whether this task may start ``attempt``, or in how many seconds to ask again.

    A queued attempt starts; a running one whose lease lapsed (its worker died mid-lookup
    and the message was delivered again) is taken over. Anything else is a duplicate.
    An attempt whose operation has left the states it was queued for is abandoned
    (``_LOOKED_UP_IN``). Under the operation's lock.
    """
    if attempt.status not in LOOKUP_IN_FLIGHT:
        return False, 0
    if attempt.status == LookupAttempt.Status.RUNNING and attempt.lease_expires_at > now:
        return False, int((attempt.lease_expires_at - now).total_seconds()) + 1
    wanted = _LOOKED_UP_IN.get(attempt.trigger)
    if wanted is not None and operation.state not in wanted:
        lookup_abandon(operation=operation, attempt=attempt, actor=actor, reason=operation.state)
        return False, 0
    return True, 0


def _attempt_begin(attempt_id: int, actor: Actor) -> tuple[LookupAttempt | None, BackgroundLookup]:
    """Start ``attempt_id`` under its operation's lock, if it is still this task's to run."""
    with audit_transaction():
        operation_id = LookupAttempt.objects.filter(pk=attempt_id).values("operation_id")[:1]
        operation = locking(Operation.objects.filter(pk=Subquery(operation_id))).first()
        if operation is None:
            return None, BackgroundLookup(False)
        audit_chain_locked(operation)
        attempt = LookupAttempt.objects.select_for_update().get(pk=attempt_id)
        now = timezone.now()
        start, retry_in = _attempt_claim(operation, attempt, now, actor)
        if not start:
            return None, BackgroundLookup(False, operation.state, retry_in=retry_in)
        attempt.status = LookupAttempt.Status.RUNNING
        attempt.started_at = now
        attempt.lease_expires_at = now + lookup_lease(operation.provider)
        attempt.save(update_fields=["status", "started_at", "lease_expires_at"])
        attempt.operation = operation
        return attempt, BackgroundLookup(False, operation.state)


def lookup_attempt_run(*, attempt_id: int, actor: Actor = SWEEPER_ACTOR) -> BackgroundLookup:
    """Run one queued lookup attempt (the Celery task's body); safe to run twice.

    The provider is read outside any transaction; its answer is applied with the
    compare-and-set rules every lookup follows (``lookup_run``).
    """
    attempt, outcome = _attempt_begin(attempt_id, actor)
    if attempt is None:
        return outcome
    return BackgroundLookup(True, lookup_run(attempt=attempt, actor=actor).state)


# -- the batch lookup task's service -------------------------------------------------


@dataclass(frozen=True)
class BatchLookup:
    """What running a batch of queued attempts did.

    ``looked_up``: the attempts run; ``retry_ids``: those another worker holds under a
    live lease, to be run again in ``retry_in`` seconds.
    """

    looked_up: list[int] = field(default_factory=list)
    retry_ids: list[int] = field(default_factory=list)
    retry_in: int = 0


def lookup_batch_run(*, attempt_ids: list[int], actor: Actor = SWEEPER_ACTOR) -> BatchLookup:
    """Run queued lookup attempts as one batch (the Celery task's body); safe to run twice.

    Each attempt is claimed by the rules of a single one (``_attempt_claim``); the
    providers are read outside any transaction, once per provider
    (``evidence_lookup_many``); the answers are applied in one transaction by the rules
    every lookup follows (``evidence_apply_many``), each operation's transition its own
    compare-and-set.
    """
    started, retry_ids, retry_in = _batch_begin(attempt_ids, actor)
    results: dict[int, LookupResult] = {}
    by_provider: dict[int, list[LookupAttempt]] = {}
    for attempt in started:
        by_provider.setdefault(attempt.operation.provider_id, []).append(attempt)
    for attempts in by_provider.values():
        provider = attempts[0].operation.provider
        found = evidence_lookup_many(
            config=provider_config(provider),
            wanted={attempt.operation.key: attempt.operation.params_digest for attempt in attempts},
        )
        for attempt in attempts:
            results[attempt.pk] = found[attempt.operation.key]
    if started:
        _batch_finish(started, results, actor)
    return BatchLookup([attempt.pk for attempt in started], retry_ids, retry_in)


def _operations_locked(ids: Any) -> dict[int, Operation]:
    """Lock the operations, in id order (the order every batch takes them in)."""
    operations = locking(Operation.objects.filter(pk__in=ids)).order_by("pk")
    return {operation.pk: audit_chain_locked(operation) for operation in operations}


def _batch_begin(
    attempt_ids: list[int], actor: Actor
) -> tuple[list[LookupAttempt], list[int], int]:
    """Start the attempts that are still this task's to run: (started, held, retry_in)."""
    with audit_transaction():
        operation_ids = LookupAttempt.objects.filter(pk__in=attempt_ids).values("operation_id")
        operations = _operations_locked(Subquery(operation_ids))
        attempts = LookupAttempt.objects.select_for_update().filter(pk__in=attempt_ids)
        now = timezone.now()
        started: list[LookupAttempt] = []
        held: list[int] = []
        retry_in = 0
        for attempt in attempts.order_by("pk"):
            operation = operations[attempt.operation_id]
            start, seconds = _attempt_claim(operation, attempt, now, actor)
            if seconds:
                held.append(attempt.pk)
                retry_in = max(retry_in, seconds)
            if not start:
                continue
            attempt.status = LookupAttempt.Status.RUNNING
            attempt.started_at = now
            attempt.lease_expires_at = now + lookup_lease(operation.provider)
            attempt.operation = operation
            started.append(attempt)
        leases: dict[Any, list[int]] = {}
        for attempt in started:
            leases.setdefault(attempt.lease_expires_at, []).append(attempt.pk)
        for lease_expires_at, ids in leases.items():
            LookupAttempt.objects.filter(pk__in=ids).update(
                status=LookupAttempt.Status.RUNNING,
                started_at=now,
                lease_expires_at=lease_expires_at,
            )
    return started, held, retry_in


def _batch_finish(
    started: list[LookupAttempt], results: dict[int, LookupResult], actor: Actor
) -> None:
    """Apply the answers under the operations' locks, as ``lookup_finish`` does one."""
    with audit_transaction():
        operations = _operations_locked([attempt.operation_id for attempt in started])
        holding = set(
            LookupAttempt.objects.filter(
                pk__in=[attempt.pk for attempt in started], status=LookupAttempt.Status.RUNNING
            ).values_list("pk", "started_at")
        )
        found = []
        for attempt in started:
            operation = operations[attempt.operation_id]
            result = results[attempt.pk]
            if (attempt.pk, attempt.started_at) not in holding:
                # Abandoned or taken over meanwhile: its successor's answer counts, once.
                stale_signal(
                    operation=operation,
                    signal=StaleSignal.LOOKUP_SUPERSEDED,
                    actor=actor,
                    data={"lookup_id": attempt.pk, "verdict": result.verdict},
                )
                continue
            attempt.operation = operation
            found.append(EvidenceFound(operation, attempt, result))
        evidence_apply_many(found=found, source=Evidence.Source.LOOKUP, actor=actor)
        reconcile = [item.operation.pk for item in found if item.operation.state == State.RECONCILE]
        if reconcile:
            Operation.objects.filter(pk__in=reconcile).update(
                next_lookup_at=timezone.now() + RECONCILE_RECHECK
            )
