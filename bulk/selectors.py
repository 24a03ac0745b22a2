"""Bulk work: the operations a queue filter selects, and the batches a console user may see.

The queue's own filter code decides what a filter matches (``queue_branch_filtered``), over the
same branches the queue reads: each unsettled state, and the stranded receipts of
settled operations. A selection is counted, or read as (id, version) pairs, never
rendered row by row.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from bulk.models import BulkBatch, BulkItem
from common.actors import Actor
from recovery.selectors.access import providers_visible_to
from recovery.selectors.queue import (
    QueueBranch,
    QueueFilters,
    capped_count_sql,
    queue_branch_filtered,
    queue_branches_for_user,
    queue_statement,
)


def _matching_branches(
    *, user: Any, filters: QueueFilters, until: datetime | None
) -> list[QueueBranch]:
    """The queue's branches under ``filters``, each as the queue filters it; disjoint.

    ``until``: only what entered its state by then (the moment the count was shown),
    so that what arrives later is not swept in.
    """
    return [
        queue_branch_filtered(branch, filters, until=until)
        for branch in queue_branches_for_user(user=user, filters=filters)
    ]


def operations_matching_count_for_user(
    *, user: Any, filters: QueueFilters, until: datetime | None = None, cap: int
) -> int:
    """How many operations of the queue ``filters`` match for ``user``: exactly up to
    ``cap``, and ``cap`` + 1 for any more (a batch's limit: past it, no selection can
    be submitted, and counting every row of a large one would cost what it grows by).
    One statement: each branch counted along its own index, the counts summed."""
    selects: list[str] = []
    params: list[Any] = []
    branches = _matching_branches(user=user, filters=filters, until=until)
    for number, branch in enumerate(branches):
        selects.append(capped_count_sql(branch, cap, f"capped_{number}"))
        params.extend(branch.condition_params)
    if not selects:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(*queue_statement(branches[0], "SELECT " + " + ".join(selects), params))
        row = cursor.fetchone()
    return min(int(row[0]), cap + 1)


def operations_matching_for_user(
    *, user: Any, filters: QueueFilters, until: datetime | None = None, limit: int
) -> list[tuple[int, int]]:
    """The (id, version) of the operations ``filters`` match, at most ``limit`` + 1 of them
    (one more than ``limit`` says the selection is above it)."""
    pairs: list[tuple[int, int]] = []
    for branch in _matching_branches(user=user, filters=filters, until=until):
        with connection.cursor() as cursor:
            cursor.execute(
                *queue_statement(
                    branch,
                    f"SELECT o.id, o.version FROM recovery_operation o WHERE {branch.condition}"
                    f" LIMIT {limit + 1 - len(pairs)}",
                    branch.condition_params,
                )
            )
            pairs += [(int(pk), int(version)) for pk, version in cursor.fetchall()]
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
