"""Watching Settle: alerts, /metrics, the status page's ages and the liveness bounds."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from settle.settings_background import (
    SETTLE_AUDIT_CHECKPOINT_SECONDS,
    SETTLE_AUDIT_VERIFY_FULL_HOURS,
    SETTLE_AUDIT_VERIFY_SECONDS,
    SETTLE_SWEEP_SECONDS,
)
from settle.settings_env import VAR_DIR, env_int, env_str

# Alerts to operators (``monitoring.services.alerts``): how often beat evaluates the rules,
# and the console's address, which every alert links into.
SETTLE_ALERTS_SECONDS = env_int("SETTLE_ALERTS_SECONDS", 60, minimum=1)
SETTLE_CONSOLE_URL = env_str("SETTLE_CONSOLE_URL", "http://127.0.0.1:8000").rstrip("/")
# Reaching approvers (``approvals.notices``): the Apprise configuration
# file (YAML or text) whose URLs carry the tags an approval's groups select; blank, no
# message goes out. When an approval's row names no time, its reminder goes this long
# after it opened, and its escalation (if it names escalation groups) this long.
SETTLE_APPROVAL_NOTIFY_CONFIG = env_str("SETTLE_APPROVAL_NOTIFY_CONFIG", "").strip()
_notify_config = Path(SETTLE_APPROVAL_NOTIFY_CONFIG)
if SETTLE_APPROVAL_NOTIFY_CONFIG and not (
    _notify_config.is_file() and os.access(_notify_config, os.R_OK)
):
    raise ImproperlyConfigured(
        f"SETTLE_APPROVAL_NOTIFY_CONFIG={SETTLE_APPROVAL_NOTIFY_CONFIG!r} is not a readable file"
    )
SETTLE_APPROVAL_REMIND_MINUTES = env_int("SETTLE_APPROVAL_REMIND_MINUTES", 15, minimum=1)
SETTLE_APPROVAL_ESCALATE_MINUTES = env_int("SETTLE_APPROVAL_ESCALATE_MINUTES", 60, minimum=1)
# How often beat sends what approvers are owed (at most one message per tag per run).
SETTLE_APPROVAL_NOTIFY_SECONDS = env_int("SETTLE_APPROVAL_NOTIFY_SECONDS", 60, minimum=1)
# How often beat counts the operations in every state into ``OperationCount``: the
# terminal states' figures on /metrics are that old at most (the others are live).
SETTLE_OPERATION_COUNTS_SECONDS = env_int("SETTLE_OPERATION_COUNTS_SECONDS", 300, minimum=10)
# /metrics answers only with this bearer token; without one configured it answers 404.
SETTLE_METRICS_TOKEN = env_str("SETTLE_METRICS_TOKEN", "")
if SETTLE_METRICS_TOKEN and len(SETTLE_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("SETTLE_METRICS_TOKEN must be at least 16 characters long")
# prometheus-client's multiprocess mode: every process of this machine (web, worker)
# writes its counters here, and /metrics sums them. It must be in the environment before
# prometheus_client is imported, which no module does before the settings are read.
SETTLE_METRICS_DIR = Path(
    env_str(
        "SETTLE_METRICS_DIR", os.environ.get("PROMETHEUS_MULTIPROC_DIR") or str(VAR_DIR / "metrics")
    )
)
SETTLE_METRICS_DIR.mkdir(parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(SETTLE_METRICS_DIR)
# The status page (and /healthz?detail=1) turns a fact red past these ages; beat's is
# SETTLE_LIVENESS_BEAT_SECONDS below, the one /livez judges by, so the two never disagree.
SETTLE_STATUS_LOOKUP_LAG_SECONDS = env_int("SETTLE_STATUS_LOOKUP_LAG_SECONDS", 300, minimum=1)
SETTLE_STATUS_WEBHOOK_LAG_SECONDS = env_int("SETTLE_STATUS_WEBHOOK_LAG_SECONDS", 300, minimum=1)
# An audit event unsigned this long means checkpoints are late (the older name still
# read); a routine verification older than SETTLE_AUDIT_VERIFY_LATE_SECONDS, or a full
# one older than SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS, means verification is late.
SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS",
    env_int(
        "SETTLE_STATUS_CHECKPOINT_STALE_SECONDS",
        3 * SETTLE_AUDIT_CHECKPOINT_SECONDS + 60,
        minimum=1,
    ),
    minimum=1,
)
SETTLE_STATUS_CHECKPOINT_STALE_SECONDS = SETTLE_AUDIT_CHECKPOINT_LATE_SECONDS
SETTLE_AUDIT_VERIFY_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_VERIFY_LATE_SECONDS", 2 * SETTLE_AUDIT_VERIFY_SECONDS + 300, minimum=1
)
SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS = env_int(
    "SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS", 2 * 3600 * SETTLE_AUDIT_VERIFY_FULL_HOURS, minimum=1
)
# Liveness, judged by the web processes from the database alone (/livez and the
# settle_*_last_seen_seconds gauges): beat is silent when it published no sweep for
# SETTLE_LIVENESS_BEAT_SECONDS, a queue's workers when none of them ran the queue's
# heartbeat (each worker sends one every SETTLE_WORKER_HEARTBEAT_SECONDS) for
# SETTLE_LIVENESS_WORKER_SECONDS.
SETTLE_WORKER_HEARTBEAT_SECONDS = env_int("SETTLE_WORKER_HEARTBEAT_SECONDS", 10, minimum=1)
SETTLE_LIVENESS_BEAT_SECONDS = env_int(
    "SETTLE_LIVENESS_BEAT_SECONDS",
    # The status page's own threshold before it was this one: still read.
    env_int("SETTLE_STATUS_SWEEP_STALE_SECONDS", max(60, 6 * SETTLE_SWEEP_SECONDS), minimum=1),
    minimum=1,
)
SETTLE_LIVENESS_WORKER_SECONDS = env_int(
    "SETTLE_LIVENESS_WORKER_SECONDS", max(120, 6 * SETTLE_WORKER_HEARTBEAT_SECONDS), minimum=1
)
if SETTLE_LIVENESS_BEAT_SECONDS <= SETTLE_SWEEP_SECONDS:
    raise ImproperlyConfigured(
        "SETTLE_LIVENESS_BEAT_SECONDS must be longer than SETTLE_SWEEP_SECONDS"
    )
if SETTLE_LIVENESS_WORKER_SECONDS <= SETTLE_WORKER_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured(
        "SETTLE_LIVENESS_WORKER_SECONDS must be longer than SETTLE_WORKER_HEARTBEAT_SECONDS"
    )
