"""Beat's audit tasks: thin, each calls one function of the audit log and is safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from audit.checkpoints import audit_checkpoint as audit_checkpoint_make
from audit.verification import audit_verification_incremental, audit_verify_job_step


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
