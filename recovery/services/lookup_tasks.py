"""The lookup tasks' bodies: a Celery worker runs the attempts that were queued.

``lookup_batch_run`` is what the batch task calls: it starts the queued attempts, reads
their provider once and applies the answers in one transaction, each judged by the
rules every lookup follows (``evidence_apply_many``). ``lookup_attempt_run`` runs one
attempt with ``lookup_run``, the same code as ``operation_lookup``. A duplicate or
redelivered message changes nothing: the attempt is no longer queued, or is running
under another worker's live lease (then: retry after that lease). An attempt whose
operation left the states it was queued for is abandoned (``_LOOKED_UP_IN``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Subquery
from django.utils import timezone

from approvals.actors import Actor
from audit.chain import audit_chain_locked, audit_transaction
from recovery.adapters import LookupResult, evidence_lookup_many
from recovery.metrics import lookup_timed
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    UNSETTLED_STATES,
    Evidence,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.evidence import EvidenceFound, evidence_apply_many
from recovery.services.locking import locking
from recovery.services.lookups import (
    RECONCILE_RECHECK,
    SWEEPER_ACTOR,
    lookup_abandon,
    lookup_lease,
    lookup_run,
)
from recovery.services.providers import provider_config
from recovery.services.runs import lookups_record
from recovery.services.stale_signals import stale_signal
from recovery.vocabulary import StaleSignal

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
    if attempt.status == LookupAttempt.Status.RUNNING and attempt.lease_alive(now):
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
        with lookup_timed(provider.name):
            found = evidence_lookup_many(
                config=provider_config(provider),
                wanted={
                    attempt.operation.key: attempt.operation.params_digest for attempt in attempts
                },
            )
        for attempt in attempts:
            results[attempt.pk] = found[attempt.operation.key]
    if started:
        _batch_finish(started, results, actor)
    for attempts in by_provider.values():
        lookups_record(
            provider=attempts[0].operation.provider,
            verdicts=[results[attempt.pk].verdict for attempt in attempts],
        )
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
