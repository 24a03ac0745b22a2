"""The lookup tasks' bodies: a Celery worker runs the attempts that were queued.

``lookup_batch_run`` is what the batch task calls: it starts the queued attempts, reads
their provider once and applies the answers in one transaction, each judged by the
rules every lookup follows (``lookups_run``). ``lookup_attempt_run`` is the same steps
for one attempt, the code ``operation_lookup`` runs too. A duplicate or
redelivered message changes nothing: the attempt is no longer queued, or is running
under another worker's live lease (then: retry after that lease). An attempt whose
operation left the states it was queued for is abandoned (``_LOOKED_UP_IN``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Subquery
from django.utils import timezone

from audit.chain import audit_transaction
from common.actors import Actor
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    UNSETTLED_STATES,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.locking import operations_locked_by_id
from recovery.services.lookups import (
    SWEEPER_ACTOR,
    lookup_abandon,
    lookup_lease,
    lookup_run,
    lookups_run,
)

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
    """Start ``attempt_id`` under its operation's lock, if it is still this task's to run:
    ``_batch_begin`` of one."""
    started, operations, _, retry_in = _batch_begin([attempt_id], actor)
    if started:
        return started[0], BackgroundLookup(False, started[0].operation.state)
    state = next((operation.state for operation in operations.values()), "")
    return None, BackgroundLookup(False, state, retry_in=retry_in)


def lookup_attempt_run(*, attempt_id: int, actor: Actor = SWEEPER_ACTOR) -> BackgroundLookup:
    """Run one queued lookup attempt (the Celery task's body); safe to run twice.

    The batch task's steps for one attempt: started as ``_batch_begin`` starts them, the
    provider read outside any transaction and its answer applied with the
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
    providers are read outside any transaction, once per provider, and the answers
    applied in one transaction by the rules every lookup follows (``lookups_run``), each
    operation's transition its own compare-and-set.
    """
    started, _, held, retry_in = _batch_begin(attempt_ids, actor)
    lookups_run(attempts=started, actor=actor)
    return BatchLookup([attempt.pk for attempt in started], held, retry_in)


def _batch_begin(
    attempt_ids: list[int], actor: Actor
) -> tuple[list[LookupAttempt], dict[int, Operation], list[int], int]:
    """Start the attempts that are still this task's to run, under their operations'
    locks: (started, the operations locked by id, those held by another worker, in how
    many seconds to ask again for those)."""
    with audit_transaction():
        operation_ids = LookupAttempt.objects.filter(pk__in=attempt_ids).values("operation_id")
        operations = operations_locked_by_id(Subquery(operation_ids))
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
    return started, operations, held, retry_in
