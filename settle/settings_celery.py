"""Celery: the queues, how tasks are acknowledged and bounded, and beat's schedule."""

from __future__ import annotations

from settle.settings_background import (
    SETTLE_AUDIT_CHECKPOINT_SECONDS,
    SETTLE_AUDIT_VERIFY_FULL_SECONDS,
    SETTLE_AUDIT_VERIFY_SECONDS,
    SETTLE_BULK_RESUME_SECONDS,
    SETTLE_DASHBOARD_REFRESH_SECONDS,
    SETTLE_SWEEP_SECONDS,
    SETTLE_WEBHOOK_SECONDS,
)
from settle.settings_broker import SETTLE_BROKER_PUBLISH_RETRIES
from settle.settings_env import VAR_DIR, env_str
from settle.settings_monitoring import (
    SETTLE_ALERTS_SECONDS,
    SETTLE_APPROVAL_NOTIFY_SECONDS,
    SETTLE_OPERATION_COUNTS_SECONDS,
)

# One queue name per deployment (and per test run, so parallel runs never collide).
CELERY_TASK_DEFAULT_QUEUE = env_str("SETTLE_CELERY_QUEUE", "settle")
# Webhook deliveries have a queue of their own, consumed by a worker of its own
# (`celery -A settle worker -Q settle-webhooks`): a receiver that accepts and never
# answers holds only that worker, never the ones the sweep and the lookups need.
# Set it to SETTLE_CELERY_QUEUE (or blank) to deliver on the one queue, unprotected.
SETTLE_WEBHOOK_QUEUE = (
    env_str("SETTLE_WEBHOOK_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}-webhooks")
    or CELERY_TASK_DEFAULT_QUEUE
)
# Acknowledge after the task ran, not on receipt: a worker that dies mid-task leaves its
# message to be delivered again; every task is safe to run twice.
CELERY_TASK_ACKS_LATE = True
# A pool process killed mid-task (SIGKILL, OOM, hard limit) requeues its message at once
# instead of acknowledging it as failed.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Reserve one message at a time: lookups are slow and uneven, and a second reserved
# message would wait behind the first instead of going to an idle worker.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A lookup is bounded by its provider's timeout (at most 60 s, a database constraint):
# past 75 s something is stuck; the soft limit raises inside the task so it ends cleanly.
CELERY_TASK_SOFT_TIME_LIMIT = 75
# The hard limit kills the pool process; its lookup's lease lapses and it is run again.
CELERY_TASK_TIME_LIMIT = 90
# Nobody reads task results: outcomes are in the database, on the operation's record.
CELERY_TASK_IGNORE_RESULT = True
# Give up publishing quickly when the broker is down: the durable due time on the row,
# not the message, schedules the work, and the next sweep publishes again.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": SETTLE_BROKER_PUBLISH_RETRIES,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # a worker waits for its broker
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    # Lapsed leases to unknown, due lookups queued. A sweep not started within one
    # interval is dropped (expires): the next one does the same work.
    "sweep": {
        "task": "recovery.tasks.sweep",
        "schedule": float(SETTLE_SWEEP_SECONDS),
        "options": {"expires": float(SETTLE_SWEEP_SECONDS)},
    },
    # Bounds the window of audit events no signed checkpoint covers yet.
    "audit-checkpoint": {
        "task": "audit.tasks.audit_checkpoint",
        "schedule": float(SETTLE_AUDIT_CHECKPOINT_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_CHECKPOINT_SECONDS)},
    },
    # Running bulk batches whose lease lapsed with items pending are published again.
    "bulk-resume": {
        "task": "bulk.tasks.bulk_resume",
        "schedule": float(SETTLE_BULK_RESUME_SECONDS),
        "options": {"expires": float(SETTLE_BULK_RESUME_SECONDS)},
    },
    "dashboard-refresh": {
        "task": "console.tasks.dashboard_refresh",
        "schedule": float(SETTLE_DASHBOARD_REFRESH_SECONDS),
        "options": {"expires": float(SETTLE_DASHBOARD_REFRESH_SECONDS)},
    },
    # Due webhooks delivered, and any message left waiting behind nothing made due.
    "webhooks-deliver": {
        "task": "webhooks.tasks.webhooks_deliver",
        "schedule": float(SETTLE_WEBHOOK_SECONDS),
        "options": {
            "expires": float(SETTLE_WEBHOOK_SECONDS),
            "queue": SETTLE_WEBHOOK_QUEUE,
        },
    },
    # Alert rules evaluated; grouped messages and "resolved" ones sent.
    "alerts": {
        "task": "monitoring.tasks.alerts_evaluate",
        "schedule": float(SETTLE_ALERTS_SECONDS),
        "options": {"expires": float(SETTLE_ALERTS_SECONDS)},
    },
    # Approvers told of approvals opened, due for a reminder or an escalation, expired:
    # one message per channel tag per run. Safe to run more often, or twice at once.
    "approval-notices": {
        "task": "monitoring.tasks.approval_notices",
        "schedule": float(SETTLE_APPROVAL_NOTIFY_SECONDS),
        "options": {"expires": float(SETTLE_APPROVAL_NOTIFY_SECONDS)},
    },
    # The snapshot of operations by state that /metrics reads for the terminal states.
    "operation-counts": {
        "task": "monitoring.tasks.operation_counts",
        "schedule": float(SETTLE_OPERATION_COUNTS_SECONDS),
        "options": {"expires": float(SETTLE_OPERATION_COUNTS_SECONDS)},
    },
    "audit-verify": {
        "task": "audit.tasks.audit_verify",
        "schedule": float(SETTLE_AUDIT_VERIFY_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_VERIFY_SECONDS)},
    },
    # One slice of the full verification job, which goes on from where the last stopped.
    "audit-verify-full": {
        "task": "audit.tasks.audit_verify_full",
        "schedule": float(SETTLE_AUDIT_VERIFY_FULL_SECONDS),
        "options": {"expires": float(SETTLE_AUDIT_VERIFY_FULL_SECONDS)},
    },
    # Ended sessions out of the session table (Django's clearsessions) and out of the
    # list of a person's sessions, which every sign-in of theirs reads.
    "sessions-clear": {
        "task": "identity.tasks.sessions_clear",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
}
