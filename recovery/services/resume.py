"""Resume: what a fresh worker should do about an operation; never a second dispatch.

One transaction under the operation's lock, and never a lookup inside the request: a
lookup is handed to a background worker, and the host asks again after ``retry_after``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from audit.chain import audit_transaction
from common.actors import Actor
from dbsql.rows import select_first_at
from recovery.models import (
    UNSETTLED_STATES,
    Dispatch,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.dispatch import dispatch_locked, lease_lapsed
from recovery.services.locking import OperationRef, operation_lock
from recovery.services.lookups import lookup_claim, lookup_publish, seconds_until
from recovery.services.refusals import refusals_recorded

# What a host is told to wait while a lookup of its operation is queued or running: a
# background worker usually has the answer in well under a second.
LOOKUP_POLL_SECONDS = 1


class Decision:
    WAIT = "wait"
    DISPATCH = "dispatch"
    IN_PROGRESS = "in_progress"
    RELEASED = "released"
    UNKNOWN = "unknown"
    RECONCILE = "reconcile"
    CLOSED = "closed"


@dataclass(frozen=True)
class ResumeOutcome:
    decision: str
    state: str
    recovered: bool
    fencing_token: str = ""
    # Seconds until asking again is worth it, when something is pending: a live lease,
    # a lookup queued or running, or the next lookup's due time.
    retry_after: int = 0


_SETTLED_DECISIONS = {
    State.RELEASED: Decision.RELEASED,
    State.UNKNOWN: Decision.UNKNOWN,
    State.RECONCILE: Decision.RECONCILE,
    State.AWAITING_APPROVAL: Decision.WAIT,
    # Approved but not consumed by this call (a refusal was recorded): not ours to run.
    State.APPROVED: Decision.WAIT,
    State.DISPATCHED: Decision.IN_PROGRESS,
}


def _answer(operation: Operation, retry_after: int = 0, in_flight: bool = False) -> ResumeOutcome:
    decision = _SETTLED_DECISIONS.get(State(operation.state), Decision.CLOSED)
    if in_flight and operation.state in UNSETTLED_STATES:
        # A lookup of it is queued or running (this call's, the sweeper's, an
        # operator's): its answer is coming.
        decision = Decision.IN_PROGRESS
    return ResumeOutcome(decision, operation.state, operation.recovered, retry_after=retry_after)


@refusals_recorded()
def operation_resume(
    *, operation: Operation | OperationRef, worker: str, actor: Actor
) -> ResumeOutcome:
    """What a fresh worker should do about ``operation``; never a second dispatch.

    Only an operation that was never dispatched can be dispatched, by winning its
    permit. A dispatch whose lease is alive is ``in_progress`` until the lease ends. One
    whose lease lapsed is moved to ``unknown``, and an unsettled operation whose next
    lookup is due gets a lookup queued for a background worker, published once this
    transaction commits: ``in_progress`` while it (or another lookup of it) is queued or
    running, then what its evidence settled. An operation whose next lookup is not due
    is answered as it stands, with ``retry_after``. Evidence alone releases (rule 4).
    """
    with audit_transaction():
        locked = operation_lock(operation)
        if locked.state == State.APPROVED:
            outcome = dispatch_locked(
                locked, worker=worker, presented_digest=locked.params_digest, actor=actor
            )
            if outcome.dispatch is not None:
                return ResumeOutcome(
                    Decision.DISPATCH, outcome.state, False, outcome.dispatch.fencing_token
                )
            return _answer(locked)
        if locked.state == State.DISPATCHED:
            dispatch, now = select_first_at(Dispatch, operation=locked.pk)
            assert dispatch is not None, "a dispatched operation has its dispatch"
            if dispatch.lease_alive(now):  # its worker still holds it
                return _answer(locked, seconds_until(dispatch.lease_expires_at, now))
            lease_lapsed(locked, dispatch, actor)
        if locked.state not in UNSETTLED_STATES:
            return _answer(locked)
        slot = lookup_claim(
            operation=locked,
            trigger=LookupAttempt.Trigger.RESUME,
            actor=actor,
            due_only=True,
            queued=True,
        )
        attempt = slot.attempt
        if attempt is not None:
            transaction.on_commit(lambda: lookup_publish(attempt))
    if attempt is None and not slot.in_flight:
        return _answer(locked, slot.retry_after)
    return _answer(locked, LOOKUP_POLL_SECONDS, in_flight=True)
