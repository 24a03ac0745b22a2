"""Bulk work: the operations a queue filter selects, and the batches a console user may see.

The queue's own filter code decides what a filter matches (``_queue_branch``), over the
same branches the queue reads: each unsettled state, and the stranded receipts of
settled operations. A selection is counted, or read as (id, version) pairs, never
rendered row by row.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from approvals.actors import Actor
from recovery.models import BulkBatch, BulkItem, Dispatch, Operation, State
from recovery.selectors.access import providers_visible_to
from recovery.selectors.queue import QUEUE_STATES, QUEUE_STRANDED, QueueFilters, _queue_branch


def _matching_branches(
    *, user: Any, filters: QueueFilters, until: datetime | None
) -> list[QuerySet[Operation]]:
    """The queue's branches under ``filters``, each as the queue filters it; disjoint.

    ``until``: only what entered its state by then (the moment the count was shown),
    so that what arrives later is not swept in.
    """
    visible = providers_visible_to(user=user)
    states = [filters.state] if filters.state in QUEUE_STATES else list(QUEUE_STATES)
    branches: list[QuerySet[Operation]] = []
    if filters.state != QUEUE_STRANDED and filters.reason != QUEUE_STRANDED:
        branches += [Operation.objects.filter(state=s, provider__in=visible) for s in states]
    if filters.state in ("", QUEUE_STRANDED) and filters.reason in ("", QUEUE_STRANDED):
        stranded = Operation.objects.filter(
            provider__in=visible, dispatch__receipt_status=Dispatch.ReceiptStatus.RUNNING
        ).exclude(state=State.DISPATCHED)
        if not filters.state:  # the unsettled ones are in the first branches
            stranded = stranded.exclude(state__in=QUEUE_STATES)
        branches.append(stranded)
    if until is not None:
        branches = [branch.filter(updated_at__lte=until) for branch in branches]
    return [_queue_branch(branch, filters, None).order_by() for branch in branches]


def operations_matching_count_for_user(
    *, user: Any, filters: QueueFilters, until: datetime | None = None
) -> int:
    """How many operations of the queue ``filters`` match for ``user``: counts only."""
    return sum(
        branch.count() for branch in _matching_branches(user=user, filters=filters, until=until)
    )


def operations_matching_for_user(
    *, user: Any, filters: QueueFilters, until: datetime | None = None, limit: int
) -> list[tuple[int, int]]:
    """The (id, version) of the operations ``filters`` match, at most ``limit`` + 1 of them
    (one more than ``limit`` says the selection is above it)."""
    pairs: list[tuple[int, int]] = []
    for branch in _matching_branches(user=user, filters=filters, until=until):
        pairs += branch.values_list("pk", "version")[: limit + 1 - len(pairs)]
        if len(pairs) > limit:
            break
    return pairs


def bulk_batches_for_user(*, user: Any) -> QuerySet[BulkBatch]:
    """The batches ``user`` proposed, and those holding an operation ``user`` may view."""
    visible = providers_visible_to(user=user)
    held = BulkItem.objects.filter(batch=OuterRef("pk"), operation__provider__in=visible)
    return BulkBatch.objects.filter(Q(proposed_by=Actor.of("user", user)) | Exists(held))


def bulk_batch_for_user(*, user: Any, batch_id: uuid.UUID) -> BulkBatch | None:
    return bulk_batches_for_user(user=user).filter(pk=batch_id).first()


def bulk_items_for_user(*, user: Any, batch: BulkBatch) -> QuerySet[BulkItem]:
    """The batch's items ``user`` may see: all of them for its proposer (the ids they sent),
    else those of the providers ``user`` may view."""
    items = BulkItem.objects.filter(batch=batch).select_related("operation").order_by("pk")
    if batch.proposed_by == Actor.of("user", user):
        return items
    return items.filter(operation__provider__in=providers_visible_to(user=user))
