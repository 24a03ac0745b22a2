"""A running batch: its chunks published, done by workers, finished, resumed.

publish
    The request that submits (or approves) a batch (``bulk.services``) publishes one
    message, after its commit; its task publishes the chunks (``bulk_publish_later``),
    so a broker that is slow or gone costs the request one publish at most.
chunk
    A range of item ids; a worker does each pending item of it (``bulk.items``), locked
    and skipped unless still pending, so running a chunk twice does each item once.
resume
    A running batch holds a lease (``Leased``) that its chunks renew as they go; beat's
    ``bulk_resume`` publishes again the chunks of a batch whose lease lapsed while items
    were pending (a worker died, a message was lost).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from bulk.items import bulk_confirm_many, bulk_item_run
from bulk.models import BulkBatch, BulkItem

logger = logging.getLogger(__name__)

Action = BulkBatch.Action
Status = BulkBatch.Status
ItemStatus = BulkItem.Status


def bulk_lease_until(now: datetime | None = None) -> datetime:
    """When a running batch's lease lapses if nothing renews it from ``now``."""
    return (now or timezone.now()) + timedelta(seconds=settings.SETTLE_BULK_LEASE_SECONDS)


def bulk_publish_later(*, batch_id: uuid.UUID) -> bool:
    """After the commit, one message whose task publishes the batch's chunks; False
    (logged) when the broker did not take it.

    The request that submitted or approved the batch publishes this one message at
    most, however many chunks the batch has. A message that never left is made up for
    by ``bulk_resume`` when the batch's lease lapses.
    """
    try:
        current_app.send_task(
            "bulk.tasks.bulk_publish",
            args=[str(batch_id)],
            queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        )
    except Exception as exc:  # the broker's errors vary by transport
        logger.warning("publishing batch %s failed: %r", batch_id, exc)
        return False
    return True


def bulk_publish_run(*, batch_id: uuid.UUID | str) -> int:
    """The task of ``bulk_publish_later``: publish a running batch's chunks; how many."""
    batch = BulkBatch.objects.filter(pk=batch_id, status=Status.RUNNING).first()
    if batch is None:
        return 0
    return bulk_publish(batch)


def bulk_publish(batch: BulkBatch, *, send: Callable[..., object] | None = None) -> int:
    """Publish the batch's pending items as chunks of ``SETTLE_BULK_CHUNK`` ids; how many.

    A chunk names a range of item ids; running one twice does each item once. A message
    the broker did not take is published again by ``bulk_resume`` when the lease lapses.
    """
    ids = list(
        BulkItem.objects.filter(batch=batch, status=ItemStatus.PENDING)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    size = settings.SETTLE_BULK_CHUNK
    published = 0
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        args = [str(batch.pk), chunk[0], chunk[-1]]
        try:
            if send is not None:
                send(*args)
            else:
                current_app.send_task(
                    "bulk.tasks.bulk_chunk",
                    args=args,
                    queue=settings.CELERY_TASK_DEFAULT_QUEUE,
                )
        except Exception as exc:  # the broker's errors vary by transport
            logger.warning("publishing a chunk of batch %s failed: %r", batch.pk, exc)
            continue
        published += 1
    if not ids:
        bulk_finish_if_done(batch_id=batch.pk)
    return published


def bulk_chunk_run(*, batch_id: uuid.UUID | str, first: int, last: int) -> int:
    """Do the pending items of the batch with ids in ``first``..``last``; how many were done.

    Safe to run twice, and beside another worker on the same chunk: each item is
    locked and skipped unless still pending.
    """
    batch = BulkBatch.objects.filter(pk=batch_id, status=Status.RUNNING).first()
    if batch is None:
        return 0
    ids = list(
        BulkItem.objects.filter(batch=batch, status=ItemStatus.PENDING, pk__gte=first, pk__lte=last)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    ran = 0
    renewed = timezone.now()
    _lease_renew(batch)
    if batch.action == Action.CONFIRM:
        try:
            ran = bulk_confirm_many(batch, ids)
        except Exception:
            # Rolled back, every item with it; each is then done on its own below.
            logger.exception("bulk confirm of items %s..%s failed as a whole", first, last)
        else:
            ids = []
    for item_id in ids:
        if timezone.now() - renewed > timedelta(seconds=1):
            renewed = timezone.now()
            _lease_renew(batch)
        ran += bulk_item_run(batch=batch, item_id=item_id)
    bulk_finish_if_done(batch_id=batch.pk)
    return ran


def _lease_renew(batch: BulkBatch) -> None:
    BulkBatch.objects.filter(pk=batch.pk, status=Status.RUNNING).update(
        lease_expires_at=bulk_lease_until()
    )


def bulk_counts(*, batch_id: uuid.UUID) -> dict[str, int]:
    """How many of the batch's items are pending, done and refused: one grouped count."""
    counts = {str(status): 0 for status in ItemStatus}
    grouped = (
        BulkItem.objects.filter(batch_id=batch_id)
        .values("status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for line in grouped:
        counts[line["status"]] = line["n"]
    return counts


def bulk_finish_if_done(*, batch_id: uuid.UUID) -> bool:
    """Mark a running batch finished, with its counts, once no item is pending."""
    if BulkItem.objects.filter(batch_id=batch_id, status=ItemStatus.PENDING).exists():
        return False
    counts = bulk_counts(batch_id=batch_id)
    changed = BulkBatch.objects.filter(pk=batch_id, status=Status.RUNNING).update(
        status=Status.FINISHED,
        finished_at=timezone.now(),
        done_count=counts[ItemStatus.DONE],
        refused_count=counts[ItemStatus.REFUSED],
    )
    return changed == 1


def bulk_resume(*, send: Callable[..., object] | None = None) -> list[uuid.UUID]:
    """Beat's check: publish again each running batch whose lease lapsed; their ids.

    A lapsed lease means no worker made progress for ``SETTLE_BULK_LEASE_SECONDS``: its
    worker died or its messages were lost. The lease is taken anew by a compare-and-set
    on its old value, so two beats publish a batch once; a duplicate would still do no
    item twice.
    """
    now = timezone.now()
    resumed = []
    lapsed = BulkBatch.objects.filter(status=Status.RUNNING, lease_expires_at__lte=now)
    for batch in lapsed:
        if bulk_finish_if_done(batch_id=batch.pk):
            continue
        taken = BulkBatch.objects.filter(
            Q(pk=batch.pk) & Q(lease_expires_at=batch.lease_expires_at)
        ).update(lease_expires_at=bulk_lease_until(now))
        if taken == 1:
            bulk_publish(batch, send=send)
            resumed.append(batch.pk)
    return resumed
