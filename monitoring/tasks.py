"""Monitoring's Celery tasks: beat's alert evaluation, messages to approvers
(``approvals.notices``) and count snapshot, the workers' heartbeats. Thin, as every
task: each calls one service and is safe to run twice.
"""

from __future__ import annotations

import time

from celery import shared_task

from approvals.notices import approval_notices_run
from monitoring.services.alerts import alerts_evaluate as alerts_evaluate_run
from monitoring.services.pulses import operation_counts_refresh, queue_pulse_record
from recovery.selectors.records import operations_params_canonical


@shared_task
def alerts_evaluate() -> int:
    """Beat's evaluation of the alert rules; how many messages it sent."""
    return len(alerts_evaluate_run())


@shared_task
def approval_notices() -> int:
    """Beat's messages to approvers, one per channel tag; how many were delivered.

    Here, above the operations' app, because each message shows its operation's
    parameters, which ``approvals`` cannot read itself.
    """
    return approval_notices_run(params_of=operations_params_canonical).delivered


@shared_task
def operation_counts() -> int:
    """Beat's snapshot of operations by provider and state, for /metrics."""
    return operation_counts_refresh()


@shared_task
def worker_heartbeat(queue: str, sent_at: float) -> None:
    """A worker's heartbeat to ``queue`` (``settle.celery.QueueHeartbeat``), run by
    whichever worker of that queue takes it: the queue is served."""
    queue_pulse_record(queue=queue, waited=time.time() - sent_at)
