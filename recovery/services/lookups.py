"""Lookups: one at a time per operation, leased, never inside a web request.

A lookup is claimed (``lookup_claim``, under the operation's lock the caller holds),
then run (``lookup_run``: the network call outside any transaction, the answer applied
under the lock). Resume, operators and the background sweeper
(``recovery.services.sweep``) all go through these. Resume and operators claim their
attempts ``queued`` and publish them once committed (``lookup_publish``); the sweeper
queues in batches; a Celery worker runs them (``recovery.services.lookup_tasks``). So a
slow provider holds background workers, never a web worker.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from dbsql.writes import insert
from recovery.adapters import LookupResult, evidence_lookup_many
from recovery.metrics import lookup_timed
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    Evidence,
    LookupAttempt,
    Operation,
    Provider,
    State,
)
from recovery.services.evidence import (
    LOOKUP_BACKOFF_SECONDS,
    EvidenceFound,
    evidence_apply_many,
)
from recovery.services.locking import operation_lock, operations_locked_by_id
from recovery.services.providers import provider_config
from recovery.services.refusals import refusals_recorded
from recovery.services.runs import lookups_record
from recovery.services.stale_signals import stale_signal
from recovery.vocabulary import StaleSignal

logger = logging.getLogger(__name__)

# Who the sweeper and its background lookups are, on the record.
SWEEPER_ACTOR = Actor.system("sweeper")

LOOKUP_LEASE_MARGIN = timedelta(seconds=5)
# How often an operation in reconcile is looked at again by resume (operators can look
# up at any time): its evidence may be repaired at the provider.
RECONCILE_RECHECK = timedelta(seconds=LOOKUP_BACKOFF_SECONDS[-2])


@dataclass(frozen=True)
class LookupSlot:
    """The outcome of asking to look up: the attempt that may run, or when to ask again."""

    attempt: LookupAttempt | None
    retry_after: int = 0
    # Another lookup of the operation is queued or running (its lease alive).
    in_flight: bool = False


def seconds_until(moment: Any, now: Any) -> int:
    return max(1, math.ceil((moment - now).total_seconds()))  # type: ignore[no-any-return]


def lookup_claim(
    *,
    operation: Operation,
    trigger: str,
    actor: Actor,
    due_only: bool,
    queued: bool = False,
) -> LookupSlot:
    """Claim the operation's one lookup slot, for a caller that holds its lock; or say when
    to ask again.

    Refused while another lookup of the operation is in flight under a live lease, and
    while ``due_only`` and the next lookup is not due. ``queued``: the attempt waits for a
    background worker (``recovery.services.lookup_tasks``) and its lease is the time that worker
    has to start it, ``SETTLE_LOOKUP_QUEUE_SECONDS``. An attempt in flight whose lease
    lapsed is abandoned, whichever kind it was.

    One statement when the slot is free: the attempt's INSERT, which the unique index on
    attempts in flight turns away (``ON CONFLICT DO NOTHING``) when it is not; only then
    is the attempt in flight read.
    """
    now = timezone.now()
    if due_only and operation.next_lookup_at is not None and operation.next_lookup_at > now:
        return LookupSlot(None, seconds_until(operation.next_lookup_at, now))
    attempt = LookupAttempt(
        operation=operation,
        trigger=trigger,
        status=LookupAttempt.Status.QUEUED if queued else LookupAttempt.Status.RUNNING,
        started_at=now,
        lease_expires_at=now
        + (
            timedelta(seconds=settings.SETTLE_LOOKUP_QUEUE_SECONDS)
            if queued
            else lookup_lease(operation.provider)
        ),
    )
    if not insert([attempt], unless_conflict=True):
        # Read under a row lock: it may have ended since the INSERT saw it.
        in_flight = (
            LookupAttempt.objects.select_for_update()
            .filter(operation=operation, status__in=LOOKUP_IN_FLIGHT)
            .first()
        )
        if in_flight is not None and in_flight.lease_alive(now):
            return LookupSlot(None, seconds_until(in_flight.lease_expires_at, now), in_flight=True)
        if in_flight is not None:
            lookup_abandon(operation=operation, attempt=in_flight, actor=actor)
        insert([attempt])
    attempt.operation = operation
    return LookupSlot(attempt)


def lookup_publish(attempt: LookupAttempt) -> bool:
    """Send the task that runs ``attempt``; False (logged) when the broker did not take it.

    Called after the attempt committed (``transaction.on_commit``): a worker must find
    its row. A message that never left leaves the attempt queued: its lease lapses after
    ``SETTLE_LOOKUP_QUEUE_SECONDS``, and then the sweep (for an ``unknown`` operation),
    the next resume or the operator's next request queues it again. The publish gives up
    within about a second when the broker is down (``CELERY_TASK_PUBLISH_RETRY_POLICY``).
    """
    try:
        current_app.send_task(
            "recovery.tasks.lookup_attempt",
            args=[attempt.pk],
            queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        )
    except Exception as exc:  # the broker's errors vary by transport
        logger.warning("publishing lookup attempt %s failed: %r", attempt.pk, exc)
        return False
    return True


def lookups_queue(*, operations: list[Operation], actor: Actor) -> list[LookupAttempt]:
    """``lookup_claim(due_only=True, queued=True)`` for a batch the caller holds locked.

    The same rules, in two statements for the batch: the attempts in flight are read in
    one, the new queued attempts inserted in the other. An operation not due, or with
    a lookup in flight under a live lease, gets none; one whose lease lapsed is
    abandoned first.
    """
    now = timezone.now()
    due = [op for op in operations if op.next_lookup_at is None or op.next_lookup_at <= now]
    if not due:
        return []
    in_flight = {
        attempt.operation_id: attempt
        for attempt in LookupAttempt.objects.select_for_update().filter(
            operation__in=due, status__in=LOOKUP_IN_FLIGHT
        )
    }
    attempts = []
    for operation in due:
        current = in_flight.get(operation.pk)
        if current is not None:
            if current.lease_alive(now):
                continue
            lookup_abandon(operation=operation, attempt=current, actor=actor)
        attempts.append(
            LookupAttempt(
                operation=operation,
                trigger=LookupAttempt.Trigger.TASK,
                status=LookupAttempt.Status.QUEUED,
                started_at=now,
                lease_expires_at=now + timedelta(seconds=settings.SETTLE_LOOKUP_QUEUE_SECONDS),
            )
        )
    return LookupAttempt.objects.bulk_create(attempts)


def lookup_lease(provider: Provider) -> timedelta:
    """How long a running lookup of ``provider`` may take before it counts as dead."""
    return timedelta(seconds=provider.timeout_seconds) + LOOKUP_LEASE_MARGIN


def lookup_abandon(
    *, operation: Operation, attempt: LookupAttempt, actor: Actor, reason: str = "lease_lapsed"
) -> None:
    """Close an attempt in flight that will not finish (under the operation's lock)."""
    attempt.status = LookupAttempt.Status.ABANDONED
    attempt.save(update_fields=["status"])
    audit_append(
        kind=AuditKind.LOOKUP_ABANDONED,
        operation=operation,
        actor=actor,
        data={
            "lookup_id": attempt.pk,
            "started_at": attempt.started_at.isoformat(),
            "reason": reason,
        },
    )


def lookups_finish(
    *, attempts: list[LookupAttempt], results: dict[int, LookupResult], actor: Actor
) -> dict[int, Operation]:
    """Apply what the lookups found (``results``, by attempt id) and close the attempts,
    under the operations' locks, in one transaction; the operations afterwards, by id.

    Whatever happened since a lookup started is judged by the current state (rule 5).
    An operation still in ``reconcile`` is looked at again after ``RECONCILE_RECHECK``.
    A lookup that outlived its lease and was abandoned or taken over meanwhile applies
    nothing: its successor's answer counts, once; the late answer is recorded.
    """
    with audit_transaction():
        operations = operations_locked_by_id([attempt.operation_id for attempt in attempts])
        holding = set(
            LookupAttempt.objects.filter(
                pk__in=[attempt.pk for attempt in attempts], status=LookupAttempt.Status.RUNNING
            ).values_list("pk", "started_at")
        )
        found = []
        for attempt in attempts:
            operation = operations[attempt.operation_id]
            result = results[attempt.pk]
            if (attempt.pk, attempt.started_at) not in holding:
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
        reconcile = [item.operation for item in found if item.operation.state == State.RECONCILE]
        if reconcile:
            recheck_at = timezone.now() + RECONCILE_RECHECK
            Operation.objects.filter(pk__in=[operation.pk for operation in reconcile]).update(
                next_lookup_at=recheck_at
            )
            for operation in reconcile:
                operation.next_lookup_at = recheck_at
    return operations


def lookups_run(*, attempts: list[LookupAttempt], actor: Actor) -> dict[int, Operation]:
    """Read the providers' records for claimed attempts and apply them; the operations
    afterwards, by id.

    Each provider is read once for all its attempts (``evidence_lookup_many``), outside
    any transaction and holding no database lock; the answers are applied together
    (``lookups_finish``).
    """
    results: dict[int, LookupResult] = {}
    by_provider: dict[int, list[LookupAttempt]] = {}
    for attempt in attempts:
        by_provider.setdefault(attempt.operation.provider_id, []).append(attempt)
    for mine in by_provider.values():
        provider = mine[0].operation.provider
        with lookup_timed(provider.name):
            found = evidence_lookup_many(
                config=provider_config(provider),
                wanted={attempt.operation.key: attempt.operation.params_digest for attempt in mine},
            )
        for attempt in mine:
            results[attempt.pk] = found[attempt.operation.key]
    operations = lookups_finish(attempts=attempts, results=results, actor=actor) if attempts else {}
    for mine in by_provider.values():
        lookups_record(
            provider=mine[0].operation.provider,
            verdicts=[results[attempt.pk].verdict for attempt in mine],
        )
    return operations


def lookup_run(*, attempt: LookupAttempt, actor: Actor) -> Operation:
    """``lookups_run`` for one claimed attempt: the operation afterwards."""
    return lookups_run(attempts=[attempt], actor=actor)[attempt.operation_id]


@refusals_recorded()
def operation_lookup(*, operation: Operation, trigger: str, actor: Actor) -> Operation:
    """Look up now, whatever the schedule, unless a lookup of it is already running."""
    with audit_transaction():
        slot = lookup_claim(
            operation=operation_lock(operation), trigger=trigger, actor=actor, due_only=False
        )
    if slot.attempt is None:
        return Operation.objects.select_related("provider").get(pk=operation.pk)
    return lookup_run(attempt=slot.attempt, actor=actor)
