"""Bulk work's Celery tasks: each takes ids, calls one service, and is safe to run twice.

Delivery is at least once (``task_acks_late``): a redelivered or duplicated message finds
its items done or held by a live lease, and changes nothing. A message published under a
task's older name (``console.tasks.…``) before an upgrade is lost to the new workers;
nothing is: the batch's lease lapses and beat's ``bulk_resume`` publishes its pending
items again.
"""

from __future__ import annotations

from celery import shared_task

from bulk.running import bulk_chunk_run, bulk_publish_run
from bulk.running import bulk_resume as bulk_resume_run


@shared_task
def bulk_chunk(batch_id: str, first: int, last: int) -> int:
    """Do the pending items ``first``..``last`` of a bulk batch (published by the batch)."""
    return bulk_chunk_run(batch_id=batch_id, first=first, last=last)


@shared_task
def bulk_publish(batch_id: str) -> int:
    """Publish the chunks of a bulk batch just submitted or approved (published after its
    commit, so that the request publishes one message at most)."""
    return bulk_publish_run(batch_id=batch_id)


@shared_task
def bulk_resume() -> int:
    """Beat's check: publish again the running bulk batches no worker made progress on."""
    return len(bulk_resume_run())
