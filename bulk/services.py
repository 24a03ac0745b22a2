"""Bulk work: one action on many operations, each item checked and done on its own.

batch
    ``BulkBatch``: an action (look up, confirm, void) on a selection frozen at
    submission as (operation, version) pairs (``BulkItem``), with who submitted it and
    how the operations were chosen. Submitting freezes the list and nothing else, so
    that the web request stays cheap; Celery workers do the items, a chunk of item ids
    per message (``bulk.running``).
item
    Done (``bulk.items``) through the single-operation service the
    operation page uses (``operator_lookup``, ``operation_reconcile``), with every check
    it makes: the permission on the item's provider, the version frozen at submission,
    the evidence, a claim by someone else. A refusal is the item's outcome (its code and
    message) and never stops the others. The outcome is written in the transaction of
    the change it made, with the item row locked and skipped unless still pending: a
    worker killed mid-batch loses nothing and does no item twice. An id that names no
    operation, or one the submitter may not see, is refused as ``unknown_operation``.
four eyes
    A void batch waits (``proposed``) until a second person approves or rejects it as a
    whole (``bulk_decide``), never its proposer. Approving it is the four-eyes approval
    of each item: per item, the proposer's void goes through ``operation_reconcile`` and,
    where the evidence does not back it, the approver's approval through
    ``reconciliation_approve``, in one transaction; the approver's
    ``approve_reconciliations`` is checked on each item's provider.
signed
    A decision on a void batch may be signed with the decider's passkey
    (``common.statements``, kind ``bulk``): the statement names the batch, its action,
    its item count and the digest of its frozen (operation, version) pairs
    (``bulk_items_digest``), so the signature approves these very operations. Where the
    policy in force requires passkeys for a provider of its items, only signed ones
    count.
audit
    Every event an item writes is on its own operation's chain and carries the batch's
    id (``audit_tagged``); the batch's submission and decision are on the system chain.
running
    Publishing a batch's chunks, doing them, finishing it and resuming it after a lapsed
    lease are ``bulk.running``'s.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from bulk.models import BulkBatch, BulkItem
from bulk.running import bulk_counts, bulk_lease_until, bulk_publish_later
from common import statements
from common.actors import Actor
from common.canonical import canonical_dumps, sha256_digest
from common.errors import ErrorCode
from policies.services import passkey_required_for
from recovery.models import Operation
from recovery.permissions import ACTING_PERMISSIONS, ProviderPermission
from recovery.selectors.access import provider_permissions_all, providers_supervised
from recovery.services.access import actor_user
from recovery.services.errors import Forbidden, Invalid, NotFound, RecoveryError
from recovery.services.reconcile import DECISION_PERMISSIONS
from recovery.services.refusals import RefusalsCommitted
from recovery.services.signed import signed_decision_check

Action = BulkBatch.Action
Status = BulkBatch.Status
ItemStatus = BulkItem.Status

# What a batch of each action needs on a provider for its items to be done there.
# A decision's own permission is the service's; a void batch is always proposed.
ACTION_PERMISSIONS: dict[str, tuple[ProviderPermission, ...]] = {
    Action.LOOKUP: (ProviderPermission.LOOKUP_OPERATIONS,),
    Action.CONFIRM: (DECISION_PERMISSIONS[Action.CONFIRM],),
    Action.VOID: (DECISION_PERMISSIONS[Action.VOID], ProviderPermission.PROPOSE_RECONCILIATIONS),
}
# The queue offers its selection to whoever holds any of these (``user_roles``).
assert {p for needed in ACTION_PERMISSIONS.values() for p in needed} == set(ACTING_PERMISSIONS)


@dataclass(frozen=True)
class Pick:
    """One selected operation: its id and the version the selection saw."""

    ref: int
    version: int


def bulk_submit(
    *, action: str, picks: list[Pick], selection: str, reason: str, actor: Actor
) -> BulkBatch:
    """Freeze ``picks`` as a batch; a lookup or confirm batch is published to run at once.

    Refused as a whole, with nothing written, when the action is unknown, the reason
    empty, the selection empty (``empty_selection``) or above ``SETTLE_BULK_MAX_ITEMS``
    (``selection_too_large``). An id picked twice is one item (the first version
    wins). Ids that name no operation are items refused at once; everything else about
    an item (may the submitter see it, act on it, has it moved) is its own check, when
    it runs.
    """
    if action not in Action.values:
        raise Invalid(ErrorCode.UNKNOWN_ACTION, f"no bulk action {action!r}")
    if action not in bulk_actions_permitted(actor=actor):
        raise Forbidden(f"you may not {action} the operations of any provider")
    reason = reason.strip()
    if not reason:
        raise Invalid(ErrorCode.REASON_REQUIRED, "give a reason: it is recorded on every operation")
    unique: dict[int, Pick] = {}
    for pick in picks:
        unique.setdefault(pick.ref, pick)
    if not unique:
        raise Invalid(ErrorCode.EMPTY_SELECTION, "nothing was selected")
    limit = settings.SETTLE_BULK_MAX_ITEMS
    if len(unique) > limit:
        raise Invalid(
            ErrorCode.SELECTION_TOO_LARGE,
            f"{len(unique)} operations are selected and a batch holds at most {limit}: "
            "narrow the filter and submit several batches",
        )
    now = timezone.now()
    with audit_transaction():
        existing = set(Operation.objects.filter(pk__in=list(unique)).values_list("pk", flat=True))
        batch = BulkBatch.objects.create(
            id=uuid.uuid4(),
            action=action,
            status=Status.PROPOSED if action == Action.VOID else Status.RUNNING,
            reason=reason[:500],
            selection=selection[:500],
            proposed_by=actor,
            created_at=now,
            lease_expires_at=bulk_lease_until(now),
            total=len(unique),
        )
        BulkItem.objects.bulk_create(
            [
                _item(batch, pick, pick.ref in existing, now)
                for pick in sorted(unique.values(), key=lambda p: p.ref)
            ],
            batch_size=2000,
        )
        audit_append(
            kind=AuditKind.BULK_SUBMITTED,
            actor=actor,
            data={
                "batch": str(batch.pk),
                "action": action,
                "items": batch.total,
                "selection": batch.selection,
                "reason": batch.reason,
            },
        )
        if batch.status == Status.RUNNING:
            transaction.on_commit(lambda: bulk_publish_later(batch_id=batch.pk))
    return batch


def bulk_actions_permitted(*, actor: Actor) -> set[str]:
    """The actions ``actor`` may take on some provider's operations at all.

    Only the outer gate, so that a batch nobody could run is not made: each item is
    checked on its own provider when it runs. One read of the user's permissions.
    """
    user = actor_user(actor)
    if user is None:
        return set()
    held = provider_permissions_all(user=user).values()
    return {
        action
        for action, needed in ACTION_PERMISSIONS.items()
        if any(all(permission.value in codenames for permission in needed) for codenames in held)
    }


def _item(batch: BulkBatch, pick: Pick, exists: bool, now: datetime) -> BulkItem:
    if exists:
        return BulkItem(
            batch=batch, operation_id=pick.ref, operation_ref=pick.ref, version=pick.version
        )
    return BulkItem(
        batch=batch,
        operation_ref=pick.ref,
        version=pick.version,
        status=ItemStatus.REFUSED,
        code=ErrorCode.UNKNOWN_OPERATION,
        detail="no such operation",
        done_at=now,
    )


def bulk_decide(
    *,
    batch_id: uuid.UUID,
    approve: bool,
    reason: str,
    actor: Actor,
    signature: dict[str, Any] | None = None,
) -> BulkBatch:
    """Approve (then run) or reject a proposed void batch as a whole.

    Four eyes: refused for someone holding ``approve_reconciliations`` on none of its
    items' providers (``forbidden``), for a batch no longer proposed
    (``already_decided``) and for its proposer (``self_approval``). Each item's own approval is
    checked again when it runs. A rejected batch's items are all refused (``rejected``):
    nothing was done to their operations. An unsigned decision the policy wants signed
    is refused (``passkey_required``), as is a signature of another (``signature_invalid``).
    Every refusal is recorded (``bulk_refused``, on the system chain).
    """
    reason = reason.strip()
    now = timezone.now()
    decision = "approve" if approve else "reject"
    with RefusalsCommitted(then=lambda error: _refusal_record(batch_id, decision, actor, error)):
        batch = BulkBatch.objects.select_for_update().filter(pk=batch_id).first()
        if batch is None:
            raise NotFound(ErrorCode.UNKNOWN_BATCH, "no such batch")
        if not bulk_approvable(batch=batch, actor=actor):
            raise Forbidden("you may not approve voids of these operations' providers")
        if batch.status != Status.PROPOSED:
            raise RecoveryError(ErrorCode.ALREADY_DECIDED, f"the batch is already {batch.status}")
        if batch.proposed_by == actor:
            raise RecoveryError(
                ErrorCode.SELF_APPROVAL, "a proposal needs a second person: you proposed this batch"
            )
        if not reason:
            raise Invalid(ErrorCode.REASON_REQUIRED, "give a reason for the decision")
        signed = _signature_check(batch, decision, actor, signature)
        batch.decided_by = actor
        batch.decided_at = now
        batch.decision_reason = reason[:500]
        batch.signature = signature or {}
        if approve:
            batch.status = Status.RUNNING
            batch.lease_expires_at = bulk_lease_until(now)
        else:
            batch.status = Status.REJECTED
            batch.finished_at = now
            BulkItem.objects.filter(batch=batch, status=ItemStatus.PENDING).update(
                status=ItemStatus.REFUSED,
                code="rejected",
                detail=f"the batch was rejected by {actor.name}: {reason}"[:500],
                done_at=now,
            )
            _counts_written(batch)
        batch.save()
        audit_append(
            kind=AuditKind.BULK_APPROVED if approve else AuditKind.BULK_REJECTED,
            actor=actor,
            data={
                "batch": str(batch.pk),
                "action": batch.action,
                "reason": batch.decision_reason,
                **signed,
            },
        )
        if approve:
            transaction.on_commit(lambda: bulk_publish_later(batch_id=batch.pk))
    return batch


def _refusal_record(
    batch_id: uuid.UUID, decision: str, actor: Actor, refusal: RecoveryError
) -> None:
    with audit_transaction():
        refusal_append(
            kind=AuditKind.BULK_REFUSED,
            code=refusal.code,
            actor=actor,
            data={"batch": str(batch_id), "decision": decision},
        )


def bulk_items_digest(*, batch: BulkBatch) -> str:
    """The ``sha256:`` digest of the canonical JSON of the batch's frozen (operation id,
    version) pairs, in id order: what a signed decision on the batch approves."""
    pairs = BulkItem.objects.filter(batch=batch).order_by("operation_ref")
    return sha256_digest(
        canonical_dumps([list(pair) for pair in pairs.values_list("operation_ref", "version")])
    )


def _bulk_subject(batch: BulkBatch) -> dict[str, object]:
    """What a signed decision on the batch names (``common.statements.bulk_subject``)."""
    return statements.bulk_subject(
        batch_id=batch.pk,
        action=batch.action,
        items=batch.total,
        items_digest=bulk_items_digest(batch=batch),
    )


def bulk_statement(*, batch: BulkBatch, decision: str, actor: Actor) -> dict[str, str]:
    """The statement ``actor`` signs to take ``decision`` on the batch."""
    return statements.statement(
        "bulk", _bulk_subject(batch), decision=decision, person=actor.stored
    )


def bulk_passkey_required(*, batch: BulkBatch) -> bool:
    """Whether the policy in force wants a decision on the batch signed: it requires
    passkeys for a provider of one of its items."""
    providers = (
        BulkItem.objects.filter(batch=batch, operation__isnull=False)
        .order_by()
        .values_list("operation__provider__name", flat=True)
        .distinct()
    )
    return passkey_required_for(set(providers))


def _signature_check(
    batch: BulkBatch, decision: str, actor: Actor, signature: dict[str, Any] | None
) -> dict[str, Any]:
    """What the decision's audit event adds for its signature, once it is found to sign
    this batch's very items, with this decision, by this person; refused unsigned where
    the policy requires passkeys for a provider of its items."""
    if not signature:  # the items' digest is read only for a signature to match
        signed_decision_check(
            None,
            required=bulk_passkey_required(batch=batch),
            kind="bulk",
            decision=decision,
            actor=actor,
        )
        return {}
    subject = _bulk_subject(batch)
    signed_decision_check(
        signature, required=True, kind="bulk", decision=decision, actor=actor, **subject
    )
    return {"items": batch.total, "items_digest": subject["items_digest"], "signature": signature}


def bulk_approvable(*, batch: BulkBatch, actor: Actor) -> bool:
    """``actor`` supervises a provider of one of the batch's items."""
    user = actor_user(actor)
    if user is None:
        return False
    providers = providers_supervised(user=user)
    return BulkItem.objects.filter(batch=batch, operation__provider__in=providers).exists()


def _counts_written(batch: BulkBatch) -> None:
    counts = bulk_counts(batch_id=batch.pk)
    batch.done_count = counts[ItemStatus.DONE]
    batch.refused_count = counts[ItemStatus.REFUSED]
