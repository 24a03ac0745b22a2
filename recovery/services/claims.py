"""Claims: an operator marks an operation as theirs, so that two do not work the same one.

A claim is live while its holder keeps acting on the operation: each of their actions
touches it, and it lapses by itself after ``SETTLE_CLAIM_IDLE_MINUTES`` without one. While
a claim is live, other operators' actions on the operation are refused (``claimed``);
deciding a four-eyes request is not such an action, since the second pair of eyes is
by design someone else. Taking and releasing a claim are operator actions
(``recovery.services.operator``), audited on the operation's chain, refusals included.
"""

from __future__ import annotations

from django.utils import timezone

from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Operation, OperationClaim
from recovery.services.errors import RecoveryError


def claim_check(operation: Operation, actor: Actor) -> RecoveryError | None:
    """Refuse ``actor`` if someone else holds a live claim; touch the claim if they hold it.

    Runs with ``operation`` locked (claims change only under that lock). A batch of one.
    """
    return claims_check_many([operation], actor).get(operation.pk)


def claims_check_many(operations: list[Operation], actor: Actor) -> dict[int, RecoveryError]:
    """``claim_check`` for many locked operations at once: the refusals, by operation id.

    One read of their live claims and one touch of ``actor``'s own among them.
    """
    refusals = {}
    own = []
    for claim in OperationClaim.objects.live().filter(operation__in=operations):
        if claim.actor != actor:
            refusals[claim.operation_id] = _claimed(claim)
        else:
            own.append(claim.pk)
    if own:
        OperationClaim.objects.filter(pk__in=own).update(touched_at=timezone.now())
    return refusals


def _claimed(claim: OperationClaim) -> RecoveryError:
    holder = claim.actor
    who = holder.name if holder is not None else "someone"
    return RecoveryError(
        ErrorCode.CLAIMED,
        f"{who} is working on it (claimed {claim.claimed_at:%Y-%m-%d %H:%M} UTC)",
        claimed_by=str(holder),
    )
