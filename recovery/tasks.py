"""Celery tasks: thin. Each takes ids, calls one service, and is safe to run twice.

Delivery is at least once (``task_acks_late``): a redelivered or duplicated message
finds its work done or held by a live lease, and changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task
from django.conf import settings

from recovery.audit import audit_checkpoint as audit_checkpoint_make
from recovery.audit.verify import audit_verification_incremental, audit_verify_job_step
from recovery.metrics import SWEEP_SECONDS
from recovery.models import Pulse
from recovery.services.alerts import alerts_evaluate as alerts_evaluate_run
from recovery.services.lookup_tasks import lookup_attempt_run, lookup_batch_run
from recovery.services.pulses import operation_counts_refresh, pulse_record, queue_pulse_record
from recovery.services.sweep import sweep as sweep_run
from recovery.services.webhooks import webhooks_deliver as webhooks_deliver_run

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
    """Beat's sweep: lapsed leases to unknown, due lookups queued and published in batches."""
    started = time.perf_counter()
    report = sweep_run(publish_batch=lookup_batch.delay)
    seconds = time.perf_counter() - started
    SWEEP_SECONDS.observe(seconds)
    pulse_record(name=Pulse.Name.SWEEP, seconds=seconds)
    return {
        "leases_lapsed": len(report.leases_lapsed),
        "lookups_queued": len(report.lookups_queued),
        "published": report.published,
    }


@shared_task
def audit_checkpoint() -> int | None:
    """Beat's signed checkpoint of the audit chains that moved (None if none did)."""
    checkpoint = audit_checkpoint_make()
    return None if checkpoint is None else checkpoint.number


@shared_task
def audit_verify() -> bool | None:
    """Beat's routine verification: what was signed since the last verified checkpoint."""
    verification = audit_verification_incremental(
        max_events=settings.SETTLE_AUDIT_VERIFY_MAX_EVENTS
    )
    return None if verification is None else verification.ok


@shared_task
def audit_verify_full() -> str | None:
    """Beat's slice of the full verification job; where the job stands after it."""
    job = audit_verify_job_step(
        slice_events=settings.SETTLE_AUDIT_VERIFY_SLICE_EVENTS,
        restart_after_seconds=3600.0 * settings.SETTLE_AUDIT_VERIFY_FULL_HOURS,
    )
    return None if job is None else job.phase


@shared_task
def webhooks_deliver(promote: bool = True) -> dict[str, int]:
    """Deliver the due webhook messages (beat; and, without ``promote``, a commit's nudge)."""
    report = webhooks_deliver_run(promote=promote)
    return {"delivered": report.delivered, "failed": report.failed, "deferred": report.deferred}


@shared_task
def alerts_evaluate() -> int:
    """Beat's evaluation of the alert rules; how many messages it sent."""
    return len(alerts_evaluate_run())


@shared_task
def operation_counts() -> int:
    """Beat's snapshot of operations by provider and state, for /metrics."""
    return operation_counts_refresh()


@shared_task
def worker_heartbeat(queue: str, sent_at: float) -> None:
    """A worker's heartbeat to ``queue`` (``console.celery.QueueHeartbeat``), run by
    whichever worker of that queue takes it: the queue is served."""
    queue_pulse_record(queue=queue, waited=time.time() - sent_at)
