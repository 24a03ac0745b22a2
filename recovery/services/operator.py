"""What an operator does from the console, checked again on the server and audited.

Every action names the version of the operation the operator was looking at: if the
operation has moved on since, the action is refused (``stale_version``) and nothing
changes; and while another operator holds a live claim on it (``claimed``), nobody
else acts on it. Every action and every refusal — a missing permission included — is an audit
event on the operation's chain (``operator_action``, ``operator_refused``), with the
reason the operator gave.
"""

from __future__ import annotations

from approvals.actors import Actor
from recovery.audit import audit_append, audit_chain_locked, audit_transaction
from recovery.models import LookupAttempt, Operation
from recovery.services.claims import claim_check
from recovery.services.errors import RecoveryError
from recovery.services.locking import operations_locked
from recovery.services.lookups import lookup_claim, lookup_run
from recovery.services.signals import refusals_recorded


def operator_refusal_record(*, operation: Operation, action: str, code: str, actor: Actor) -> None:
    """Record a refused operator action, in a transaction of its own."""
    with audit_transaction():
        locked = audit_chain_locked(operations_locked().get(pk=operation.pk))
        audit_append(
            kind="operator_refused",
            operation=locked,
            actor=actor,
            data={"action": action, "code": code, "version": locked.version},
        )


def operator_refuse(operation: Operation, action: str, error: RecoveryError, actor: Actor) -> None:
    """Record ``error`` as a refused ``action`` (its own transaction), then raise it."""
    operator_refusal_record(operation=operation, action=action, code=error.code, actor=actor)
    raise error


def operator_locked(
    *, operation: Operation, version: int, actor: Actor
) -> tuple[Operation, RecoveryError | None]:
    """Lock the operation for an operator's action, and what refuses it, if anything.

    Refused when the operation moved on since the ``version`` the operator saw, or while
    someone else holds a live claim on it. Runs inside the caller's audit transaction.
    """
    locked = audit_chain_locked(operations_locked().get(pk=operation.pk))
    if locked.version != version:
        return locked, RecoveryError(
            "stale_version",
            f"the operation moved on: it is now {locked.state}, version {locked.version} "
            f"(you saw version {version})",
            state=locked.state,
            version=locked.version,
        )
    return locked, claim_check(locked, actor)


@refusals_recorded()
def operator_lookup(*, operation: Operation, version: int, reason: str, actor: Actor) -> Operation:
    """Look the operation's evidence up now (``lookup_operations`` was checked by the caller).

    Refused as ``operator_locked`` refuses, or while a lookup of it is in flight under a
    live lease (``lookup_claim``'s rule, the one every lookup follows). The claim and the
    ``operator_action`` that asked for it commit together; the lookup then runs with no
    lock held, as every lookup does.
    """
    slot = None
    with audit_transaction():
        locked, refusal = operator_locked(operation=operation, version=version, actor=actor)
        if refusal is None:
            slot = lookup_claim(
                operation=locked,
                trigger=LookupAttempt.Trigger.OPERATOR,
                actor=actor,
                due_only=False,
            )
            if slot.attempt is None:
                refusal = RecoveryError("lookup_in_flight", "a lookup of it is already under way")
            else:
                audit_append(
                    kind="operator_action",
                    operation=locked,
                    actor=actor,
                    data={"action": "lookup", "reason": reason, "version": version},
                )
    if refusal is not None:
        operator_refuse(operation, "lookup", refusal, actor)
    assert slot is not None and slot.attempt is not None
    return lookup_run(attempt=slot.attempt, actor=actor)
