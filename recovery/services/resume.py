"""Resume: what a fresh worker should do about an operation; never a second dispatch."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from approvals.actors import Actor
from recovery.models import (
    UNSETTLED_STATES,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.dispatch import operation_dispatch
from recovery.services.locking import OperationRef, operation_read
from recovery.services.lookups import lookup_run, lookup_start
from recovery.services.signals import refusals_recorded

# -- resume ---------------------------------------------------------------------------


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
    # Seconds until asking again is worth it: set when no lookup was made this time.
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
        # A lookup of it is queued or running (the sweeper's, an operator's): its answer
        # is coming; starting a second one would only spend the budget.
        decision = Decision.IN_PROGRESS
    return ResumeOutcome(decision, operation.state, operation.recovered, retry_after=retry_after)


@refusals_recorded()
def operation_resume(
    *, operation: Operation | OperationRef, worker: str, actor: Actor
) -> ResumeOutcome:
    """What a fresh worker should do about ``operation``; never a second dispatch.

    Only an operation that was never dispatched can be dispatched, by winning its
    permit. A lapsed lease or an unsettled operation is looked up synchronously (bounded
    by the provider's timeout) and released only on matching evidence — but only when
    its next lookup is due, no other lookup of it is running and the provider has a free
    in-request lookup slot; otherwise the answer is what is known, with ``retry_after``
    (``in_progress`` while another lookup of it is queued or running).
    """
    if isinstance(operation, OperationRef):
        operation = operation_read(operation)
    if operation.state == State.APPROVED:
        outcome = operation_dispatch(
            operation=operation,
            worker=worker,
            presented_digest=operation.params_digest,
            actor=actor,
        )
        if outcome.dispatch is not None:
            return ResumeOutcome(
                Decision.DISPATCH, outcome.state, False, outcome.dispatch.fencing_token
            )
        operation.refresh_from_db()
    if operation.state in (State.DISPATCHED, *UNSETTLED_STATES):
        slot = lookup_start(
            operation=operation,
            trigger=LookupAttempt.Trigger.RESUME,
            actor=actor,
            due_only=True,
            provider_limit=settings.SETTLE_WEB_LOOKUPS_PER_PROVIDER,
            for_resume=True,
        )
        if slot.attempt is None:
            return _answer(slot.operation, slot.retry_after, slot.in_flight)
        operation = lookup_run(attempt=slot.attempt, actor=actor)
    return _answer(operation)
