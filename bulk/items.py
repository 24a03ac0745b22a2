"""Bulk work's items: each done through its single-operation service, its outcome written
in the transaction of the change it made (what a batch is: ``bulk.services``).

An item is locked and skipped unless still pending, so that a chunk run twice, or by two
workers at once, does each item once; a refusal is the item's outcome and never stops
the others.
"""

from __future__ import annotations

import logging

from django.db import connection
from django.utils import timezone

from audit.chain import audit_tagged, audit_transaction
from bulk.models import BulkBatch, BulkItem
from common.errors import ErrorCode
from dbsql.batches import values_update
from recovery.models import Operation
from recovery.permissions import ProviderPermission
from recovery.services.errors import RecoveryError
from recovery.services.four_eyes import reconciliation_approve
from recovery.services.operator import operator_lookup, operator_permitted
from recovery.services.reconcile import Decided, operation_reconcile, operations_reconcile_many

logger = logging.getLogger(__name__)

Action = BulkBatch.Action
ItemStatus = BulkItem.Status


def bulk_confirm_many(batch: BulkBatch, ids: list[int]) -> int:
    """The confirm of ``ids`` in one transaction (``operations_reconcile_many``); how many.

    A bulk confirm is the one action thousands of operations take at once, so its chunk
    is read and written set-wise: the items and their operations locked (in that order,
    each in id order), every item's outcome written in the transaction of its change.
    """
    with audit_tagged(batch=str(batch.pk)), audit_transaction():
        items = list(
            BulkItem.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("operation__provider")
            .filter(pk__in=ids, status=ItemStatus.PENDING)
            .order_by("pk")
        )
        assert batch.proposed_by is not None
        outcomes = operations_reconcile_many(
            picks=[(item.operation, item.version) for item in items if item.operation],
            action=Action.CONFIRM,
            reason=batch.reason,
            actor=batch.proposed_by,
            propose=False,
        )
        now = timezone.now()
        for item in items:
            outcome = outcomes.get(item.operation_id) if item.operation_id else None
            if isinstance(outcome, Decided):
                item.status, item.code = ItemStatus.DONE, "confirmed"
                item.detail = f"now {outcome.operation.state}"
            elif isinstance(outcome, RecoveryError):
                item.status, item.code, item.detail = (
                    ItemStatus.REFUSED,
                    outcome.code,
                    outcome.message[:500],
                )
            else:
                item.status, item.code = ItemStatus.REFUSED, ErrorCode.UNKNOWN_OPERATION
                item.detail = "no such operation"
            item.done_at = now
        _outcomes_written(items)
    return len(items)


def _outcomes_written(items: list[BulkItem]) -> None:
    """The items' outcomes in one statement (``values_update`` on PostgreSQL)."""
    if connection.vendor != "postgresql":
        BulkItem.objects.bulk_update(items, ["status", "code", "detail", "done_at"])
        return
    values_update(
        BulkItem,
        values=[
            ("id", "id"),
            ("status", "status"),
            ("code", "code"),
            ("detail", "detail"),
            ("done_at", "done_at"),
        ],
        rows=[(i.pk, str(i.status), i.code, i.detail, i.done_at) for i in items],
        assign={name: f"v.{name}" for name in ("status", "code", "detail", "done_at")},
    )


def bulk_item_run(*, batch: BulkBatch, item_id: int) -> bool:
    """Do one item, its outcome written with the change it made; False if not pending.

    A failure that is not a refusal (a bug, a lost database) rolls the item back; it is
    then refused as ``internal_error`` in a transaction of its own, so that the batch
    still ends with a report, rather than retried for ever.
    """
    try:
        with audit_tagged(batch=str(batch.pk)), audit_transaction():
            item = (
                BulkItem.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("operation__provider")
                .filter(pk=item_id, status=ItemStatus.PENDING)
                .first()
            )
            if item is None:
                return False
            status, code, detail = _item_do(batch, item)
            BulkItem.objects.filter(pk=item.pk).update(
                status=status, code=code, detail=detail[:500], done_at=timezone.now()
            )
            return True
    except Exception:
        logger.exception("bulk item %s of batch %s failed", item_id, batch.pk)
        changed = BulkItem.objects.filter(pk=item_id, status=ItemStatus.PENDING).update(
            status=ItemStatus.REFUSED,
            code="internal_error",
            detail="an unexpected error; nothing was done (see the worker's log)",
            done_at=timezone.now(),
        )
        return changed == 1


def _item_do(batch: BulkBatch, item: BulkItem) -> tuple[str, str, str]:
    """(status, code, detail) of doing ``item`` through its single-operation service."""
    operation = item.operation
    if operation is None:
        return ItemStatus.REFUSED, ErrorCode.UNKNOWN_OPERATION, "no such operation"
    actor = batch.proposed_by
    assert actor is not None
    try:
        if batch.action == Action.LOOKUP:
            operator_lookup(
                operation=operation, version=item.version, reason=batch.reason, actor=actor
            )
            return ItemStatus.DONE, "lookup_queued", "lookup queued"
        if batch.action == Action.CONFIRM:
            decided = operation_reconcile(
                operation=operation,
                action="confirm",
                version=item.version,
                reason=batch.reason,
                actor=actor,
                propose=False,
            )
            return ItemStatus.DONE, "confirmed", f"now {decided.operation.state}"
        return _void(batch, operation, item)
    except RecoveryError as refusal:
        return ItemStatus.REFUSED, refusal.code, refusal.message


def _void(batch: BulkBatch, operation: Operation, item: BulkItem) -> tuple[str, str, str]:
    """The proposer's void, with the approver's approval where the evidence needs it."""
    approver = batch.decided_by
    assert approver is not None and batch.proposed_by is not None
    operator_permitted(
        operation=operation,
        action="approve",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=approver,
    )
    decided = operation_reconcile(
        operation=operation,
        action="void",
        version=item.version,
        reason=batch.reason,
        actor=batch.proposed_by,
    )
    if decided.request is None:
        return ItemStatus.DONE, "voided", "voided on the evidence"
    reconciliation_approve(
        operation=operation,
        request_id=decided.request.pk,
        reason=batch.decision_reason,
        actor=approver,
        batch_signed=bool(batch.signature),
    )
    return ItemStatus.DONE, "voided", f"voided, four eyes: approved by {approver.name}"
