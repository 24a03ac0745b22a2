"""Celery tasks: thin. Each takes ids, calls one service, and is safe to run twice.

Delivery is at least once (``task_acks_late``): a redelivered or duplicated message
finds its work done or held by a live lease, and changes nothing.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery import shared_task
from django.utils import timezone

from recovery.metrics import SWEEP_SECONDS
from recovery.models import Pulse
from recovery.services.approval_expiry import approvals_expire_due
from recovery.services.customers import party_link_send as party_link_send_run
from recovery.services.lookup_tasks import lookup_attempt_run, lookup_batch_run
from recovery.services.runs import pulse_record
from recovery.services.sweep import sweep as sweep_run

# A message that finds its attempt held by another worker's live lease waits for that
# lease (at most a provider timeout plus a margin); after a few such waits the sweeper
# takes over anyway.
LOOKUP_RETRIES = 5


@shared_task(bind=True, max_retries=LOOKUP_RETRIES)
def lookup_attempt(self: Any, attempt_id: int) -> str:
    """Run one queued lookup attempt (queued by the sweep)."""
    outcome = lookup_attempt_run(attempt_id=attempt_id)
    if outcome.retry_in:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.state


@shared_task(bind=True, max_retries=LOOKUP_RETRIES)
def lookup_batch(self: Any, attempt_ids: list[int]) -> int:
    """Run a batch of queued lookup attempts of one provider (queued by the sweep).

    Attempts another worker holds under a live lease are retried on their own.
    """
    outcome = lookup_batch_run(attempt_ids=attempt_ids)
    if outcome.retry_ids:
        raise self.retry(args=[outcome.retry_ids], countdown=outcome.retry_in)
    return len(outcome.looked_up)


@shared_task
def sweep() -> dict[str, int]:
    """Beat's sweep: lapsed leases to unknown, due lookups queued and published in batches,
    approvals past their ``expires_at`` expired."""
    started = time.perf_counter()
    report = sweep_run(publish_batch=lookup_batch.delay)
    approvals_expired = approvals_expire_due(now=timezone.now())
    seconds = time.perf_counter() - started
    SWEEP_SECONDS.observe(seconds)
    pulse_record(name=Pulse.Name.SWEEP, seconds=seconds)
    return {
        "leases_lapsed": len(report.leases_lapsed),
        "lookups_queued": len(report.lookups_queued),
        "published": report.published,
        "approvals_expired": approvals_expired,
    }


@shared_task
def party_link_send(approval_id: str) -> bool:
    """Send a customer approval's link to its party's contact (queued at its opening)."""
    return party_link_send_run(approval_id=uuid.UUID(approval_id))
