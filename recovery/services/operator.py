"""What an operator does from the console, checked again on the server and audited.

Every action is refused first unless the operator holds its permission on the
operation's provider (``recovery.services.access``): ``lookup_operations`` for a lookup
and for claims. Every action names the version of the operation the operator was looking at: if the
operation has moved on since, the action is refused (``stale_version``) and nothing
changes; and while another operator holds a live claim on it (``claimed``), nobody
else acts on it. Every action and every refusal — a missing permission included — is an audit
event on the operation's chain (``operator_action``, ``operator_refused``), with the
reason the operator gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from django.db import transaction
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import LookupAttempt, Operation, OperationClaim
from recovery.permissions import ProviderPermission
from recovery.services.access import provider_permission_require
from recovery.services.claims import claim_check
from recovery.services.errors import Forbidden, RecoveryError
from recovery.services.locking import operation_lock
from recovery.services.lookups import lookup_claim, lookup_publish
from recovery.services.refusals import RefusalsCommitted, refusals_recorded


class OperatorRefusals(RefusalsCommitted):
    """The one way an operator's refused ``action`` goes on the operation's chain.

    As a context it is an audit transaction whose refusal, once what it recorded is
    committed, is recorded in a transaction of its own and raised; ``refuse`` does the
    same for a refusal raised outside one; ``append`` writes it in the caller's
    transaction, on an operation the caller has locked (a batch, where one item's
    refusal must not undo the others').
    """

    def __init__(self, operation: Operation, action: str, actor: Actor) -> None:
        super().__init__(then=self._record)
        self.operation = operation
        self.action = action
        self.actor = actor

    def append(self, error: RecoveryError, *, locked: Operation | None = None) -> None:
        """The ``operator_refused`` event, on the locked operation's chain."""
        operation = self.operation if locked is None else locked
        refusal_append(
            kind=AuditKind.OPERATOR_REFUSED,
            code=error.code,
            operation=operation,
            actor=self.actor,
            data={"action": self.action, "version": operation.version},
        )

    def refuse(self, error: RecoveryError) -> NoReturn:
        """Record ``error`` (its own transaction), then raise it."""
        self._record(error)
        raise error

    def _record(self, error: RecoveryError) -> None:
        with audit_transaction():
            self.append(error, locked=operation_lock(self.operation))


def operator_permitted(
    *, operation: Operation, action: str, permission: ProviderPermission, actor: Actor
) -> frozenset[str]:
    """Refuse ``action`` unless ``actor`` holds ``permission``; what it holds, if so.

    ``NotFound`` if it may not see the operation (not recorded); ``Forbidden``, recorded,
    if it may see but not do. Checked before anything is locked: a right is the
    actor's, not the operation's state.
    """
    try:
        return provider_permission_require(
            actor=actor, provider=operation.provider, permission=permission, action=action
        )
    except Forbidden as refusal:
        OperatorRefusals(operation, action, actor).refuse(refusal)


def operator_locked(*, operation: Operation, actor: Actor, version: int | None = None) -> Operation:
    """Lock the operation for an operator's action, or refuse it.

    Refused when the operation moved on since the ``version`` the operator saw
    (``stale_version``; a claim names none), or while someone else holds a live claim
    on it (``claimed``). Runs inside the caller's transaction, whose refusal is recorded
    (``OperatorRefusals``).
    """
    locked = operation_lock(operation)
    if version is not None:
        version_check(locked, version)
    refusal = claim_check(locked, actor)
    if refusal is not None:
        raise refusal
    return locked


def version_check(locked: Operation, version: int) -> None:
    """Refuse (``stale_version``) an action on a version the operation has moved on from."""
    if locked.version != version:
        raise RecoveryError(
            ErrorCode.STALE_VERSION,
            f"the operation moved on: it is now {locked.state}, version {locked.version} "
            f"(you saw version {version})",
            state=locked.state,
            version=locked.version,
        )


@dataclass(frozen=True)
class QueuedLookup:
    """An operator's lookup, queued for a background worker.

    ``published``: a worker was told. False when the broker did not answer, or when the
    caller's own transaction has not committed yet (the message goes at its commit).
    """

    attempt: LookupAttempt
    published: bool


@refusals_recorded()
def operator_lookup(
    *, operation: Operation, version: int, reason: str, actor: Actor
) -> QueuedLookup:
    """Queue a lookup of the operation's evidence now.

    Refused without ``lookup_operations``, as ``operator_locked`` refuses, or while a
    lookup of it is in flight under a live lease (``lookup_claim``'s rule, the one every
    lookup follows). The queued attempt and the ``operator_action`` that asked for it
    commit together; a background worker then runs it (``recovery.tasks.lookup_attempt``)
    with no lock held across the provider's answer, as every lookup does. Nothing runs
    inside the web request.
    """
    operator_permitted(
        operation=operation,
        action="lookup",
        permission=ProviderPermission.LOOKUP_OPERATIONS,
        actor=actor,
    )
    published: list[bool] = []
    with OperatorRefusals(operation, "lookup", actor):
        locked = operator_locked(operation=operation, version=version, actor=actor)
        slot = lookup_claim(
            operation=locked,
            trigger=LookupAttempt.Trigger.OPERATOR,
            actor=actor,
            due_only=False,
            queued=True,
        )
        if slot.attempt is None:
            raise RecoveryError(ErrorCode.LOOKUP_IN_FLIGHT, "a lookup of it is already under way")
        audit_append(
            kind=AuditKind.OPERATOR_ACTION,
            operation=locked,
            actor=actor,
            data={"action": "lookup", "reason": reason, "version": version},
        )
        # Told only once the attempt is committed: a worker must find its row.
        attempt = slot.attempt
        transaction.on_commit(lambda: published.append(lookup_publish(attempt)))
    return QueuedLookup(attempt, published == [True])


@audit_transaction()
def _claim(operation: Operation, actor: Actor) -> OperationClaim:
    locked = operator_locked(operation=operation, actor=actor)
    now = timezone.now()
    claim, _ = OperationClaim.objects.update_or_create(
        operation=locked, defaults={"actor": actor, "claimed_at": now, "touched_at": now}
    )
    audit_append(kind=AuditKind.CLAIMED, operation=locked, actor=actor, data={})
    return claim


@audit_transaction()
def _release(operation: Operation, actor: Actor) -> None:
    locked = operator_locked(operation=operation, actor=actor)
    deleted, _ = OperationClaim.objects.filter(operation=locked).delete()
    if not deleted:
        raise RecoveryError(ErrorCode.NOT_CLAIMED, "nobody holds a claim on it")
    audit_append(kind=AuditKind.CLAIM_RELEASED, operation=locked, actor=actor, data={})


def operation_claim(*, operation: Operation, actor: Actor) -> OperationClaim:
    """Claim the operation for ``actor``; refused (and recorded) while another's is live.

    Claiming is working on it: it needs what a lookup needs, ``lookup_operations``.
    """
    operator_permitted(
        operation=operation,
        action="claim",
        permission=ProviderPermission.LOOKUP_OPERATIONS,
        actor=actor,
    )
    try:
        return _claim(operation, actor)
    except RecoveryError as exc:
        OperatorRefusals(operation, "claim", actor).refuse(exc)


def operation_claim_release(*, operation: Operation, actor: Actor) -> None:
    """Let go of one's own claim; another's live claim, or none, is refused and recorded."""
    operator_permitted(
        operation=operation,
        action="release",
        permission=ProviderPermission.LOOKUP_OPERATIONS,
        actor=actor,
    )
    try:
        _release(operation, actor)
    except RecoveryError as exc:
        OperatorRefusals(operation, "release", actor).refuse(exc)
