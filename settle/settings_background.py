"""The background work: what beat runs and how often, and the bounds of each job
(recovery sweeps and lookups, audit checkpoints, verification and exports, bulk batches,
the dashboard's rollup, webhook deliveries).
"""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from settle.settings_env import VAR_DIR, env_bool, env_int, env_str

# Every checkpoint is appended here as well, outside the database (ship it elsewhere).
SETTLE_AUDIT_CHECKPOINT_FILE = Path(
    env_str("SETTLE_AUDIT_CHECKPOINT_FILE", str(VAR_DIR / "audit-checkpoints.jsonl"))
)
# Audit exports are written here by a worker, then downloaded from the console.
SETTLE_AUDIT_EXPORT_DIR = Path(env_str("SETTLE_AUDIT_EXPORT_DIR", str(VAR_DIR / "exports")))
# How long a worker may spend writing one export before it is stopped (and marked failed).
SETTLE_AUDIT_EXPORT_SECONDS = env_int("SETTLE_AUDIT_EXPORT_SECONDS", 3600, minimum=60)

# Background recovery (recovery.services.sweep): how often beat sweeps, how many rows
# one sweep transaction takes, and how long a queued lookup may wait for a worker before
# the sweeper queues it again (its message was lost, or its publish never happened).
SETTLE_SWEEP_SECONDS = env_int("SETTLE_SWEEP_SECONDS", 5, minimum=1)
SETTLE_SWEEP_BATCH = env_int("SETTLE_SWEEP_BATCH", 200, minimum=1)
SETTLE_LOOKUP_QUEUE_SECONDS = env_int("SETTLE_LOOKUP_QUEUE_SECONDS", 60, minimum=1)
# Lookups of one provider run by one task: the provider is read once per batch (a journal
# once, a SQLite database with one query) and the answers applied in one transaction.
SETTLE_LOOKUP_BATCH = env_int("SETTLE_LOOKUP_BATCH", 200, minimum=1)
# An mcp provider's server (recovery.adapters.mcp) on this machine or a private network is
# refused at every lookup unless SETTLE_MCP_ALLOW_PRIVATE (a deployment whose MCP servers
# run inside its own network); the socket goes to the address checked.
SETTLE_MCP_ALLOW_PRIVATE = env_bool("SETTLE_MCP_ALLOW_PRIVATE", False)
# How often beat signs a checkpoint of the audit log: the window of events that no signed
# checkpoint covers yet is at most this long (plus the time a checkpoint takes).
SETTLE_AUDIT_CHECKPOINT_SECONDS = env_int("SETTLE_AUDIT_CHECKPOINT_SECONDS", 60, minimum=1)
# How often beat verifies the whole audit log (every chain, every checkpoint): what the
# audit trail page shows as "last verified". A full read of the log, so not too often.
SETTLE_AUDIT_VERIFY_SECONDS = env_int("SETTLE_AUDIT_VERIFY_SECONDS", 3600, minimum=1)
# That routine verification covers what the checkpoints signed since the last verified
# one, at most about this many events a run (a backlog takes several runs).
SETTLE_AUDIT_VERIFY_MAX_EVENTS = env_int("SETTLE_AUDIT_VERIFY_MAX_EVENTS", 2_000_000, minimum=1)
# The full verification (every event, every checkpoint) is a job done in slices: beat
# runs one slice of about SETTLE_AUDIT_VERIFY_SLICE_EVENTS events every
# SETTLE_AUDIT_VERIFY_FULL_SECONDS, and starts a new job SETTLE_AUDIT_VERIFY_FULL_HOURS
# after the last one started.
SETTLE_AUDIT_VERIFY_SLICE_EVENTS = env_int(
    "SETTLE_AUDIT_VERIFY_SLICE_EVENTS", 500_000, minimum=1000
)
SETTLE_AUDIT_VERIFY_FULL_SECONDS = env_int("SETTLE_AUDIT_VERIFY_FULL_SECONDS", 300, minimum=1)
SETTLE_AUDIT_VERIFY_FULL_HOURS = env_int("SETTLE_AUDIT_VERIFY_FULL_HOURS", 24, minimum=1)
# Bulk work (bulk.services, bulk.running): the most operations one batch may hold, how many
# items one task message does, how long a running batch may go without progress before
# beat publishes its pending items again (its worker died, its messages were lost), and
# how often beat checks.
SETTLE_BULK_MAX_ITEMS = env_int("SETTLE_BULK_MAX_ITEMS", 10000, minimum=1)
SETTLE_BULK_CHUNK = env_int("SETTLE_BULK_CHUNK", 100, minimum=1)
SETTLE_BULK_LEASE_SECONDS = env_int("SETTLE_BULK_LEASE_SECONDS", 30, minimum=1)
SETTLE_BULK_RESUME_SECONDS = env_int("SETTLE_BULK_RESUME_SECONDS", 10, minimum=1)

# How often beat adds the audit log's new events to the dashboard's rollup (lookups,
# settle times, operator actions); its figures trail the log by this plus two minutes.
SETTLE_DASHBOARD_REFRESH_SECONDS = env_int("SETTLE_DASHBOARD_REFRESH_SECONDS", 60, minimum=1)

# Webhooks to hosts (the webhooks app). An endpoint on the machine itself or a
# private network is refused unless SETTLE_WEBHOOKS_ALLOW_PRIVATE (a deployment that
# delivers inside its own network); checked when added and again at every delivery.
SETTLE_WEBHOOKS_ALLOW_PRIVATE = env_bool("SETTLE_WEBHOOKS_ALLOW_PRIVATE", False)
# One delivery's whole exchange (connect, send, status, headers, body), however slowly the
# receiver trickles it: a slow receiver costs a delivery thread this long at most. At most
# 30 s, so that a delivery task's last send ends well inside its soft time limit.
SETTLE_WEBHOOK_TIMEOUT_SECONDS = env_int("SETTLE_WEBHOOK_TIMEOUT_SECONDS", 5, minimum=1, maximum=30)
# How often beat delivers what is due (commits also nudge a delivery at once, so this is
# for retries and missed nudges: each round is a task on SETTLE_WEBHOOK_QUEUE), how many
# messages one claim takes, and how long a claim holds them: longer than a task may live
# (CELERY_TASK_TIME_LIMIT), so only a dead worker's claims lapse and are delivered again.
SETTLE_WEBHOOK_SECONDS = env_int("SETTLE_WEBHOOK_SECONDS", 10, minimum=1)
SETTLE_WEBHOOK_BATCH = env_int("SETTLE_WEBHOOK_BATCH", 50, minimum=1)
SETTLE_WEBHOOK_LEASE_SECONDS = env_int("SETTLE_WEBHOOK_LEASE_SECONDS", 120, minimum=1)
if SETTLE_WEBHOOK_LEASE_SECONDS <= SETTLE_WEBHOOK_TIMEOUT_SECONDS:
    # A send starts only while its claim outlasts its deadline: else none ever would.
    raise ImproperlyConfigured(
        f"SETTLE_WEBHOOK_LEASE_SECONDS={SETTLE_WEBHOOK_LEASE_SECONDS} must exceed "
        f"SETTLE_WEBHOOK_TIMEOUT_SECONDS={SETTLE_WEBHOOK_TIMEOUT_SECONDS}"
    )
# Retried with exponential back-off and jitter for this long, then given up (``failed``,
# an operator may redeliver); an endpoint is marked failing after this many errors in a row.
SETTLE_WEBHOOK_RETRY_HOURS = env_int("SETTLE_WEBHOOK_RETRY_HOURS", 24, minimum=1)
SETTLE_WEBHOOK_FAILING_AFTER = env_int("SETTLE_WEBHOOK_FAILING_AFTER", 5, minimum=1)
# After ``webhook rotate`` the old secret signs beside the new one for this long.
SETTLE_WEBHOOK_ROTATION_GRACE_HOURS = env_int("SETTLE_WEBHOOK_ROTATION_GRACE_HOURS", 24)
