"""The status page's judgement: each fact Settle can read about itself, green or red.

``/healthz?detail=1`` and the console's status page show these checks; the thresholds
are settings (``SETTLE_STATUS_*``, ``SETTLE_AUDIT_*_LATE_SECONDS`` and, for beat, the
one ``SETTLE_LIVENESS_BEAT_SECONDS`` that ``/livez`` also judges by).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, connection

from monitoring.selectors.health import HealthFacts, health_facts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    """One line of the status page: green or red, what it found, and since when."""

    name: str
    ok: bool
    detail: str
    at: datetime | None = None


def _database_check() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return Check("database", False, f"unreachable: {type(exc).__name__}")
    return Check("database", True, connection.vendor)


def _broker_check() -> Check:
    """Connect to the broker once, giving up within a few seconds."""
    try:
        with current_app.connection_for_write() as broker:
            broker.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except Exception as exc:  # the transports raise many types
        return Check("broker", False, f"unreachable: {type(exc).__name__}")
    return Check("broker", True, str(broker.transport_cls))  # never the URL: it may hold a password


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"


def _fact_checks(facts: HealthFacts) -> list[Check]:
    """Beat, the workers, webhook deliveries and the audit checkpoints, each red past its
    threshold."""
    sweep_limit = settings.SETTLE_LIVENESS_BEAT_SECONDS
    sweep_age = facts.sweep_age
    lookup_limit = settings.SETTLE_STATUS_LOOKUP_LAG_SECONDS
    lookup_age = facts.age(facts.last_lookup_at, facts.now)
    webhook_limit = settings.SETTLE_STATUS_WEBHOOK_LAG_SECONDS
    checkpoint_limit = settings.SETTLE_STATUS_CHECKPOINT_STALE_SECONDS
    checkpoint_age = facts.checkpoint_age
    unsigned_age = facts.age(facts.oldest_unsigned_at, facts.now)
    unsigned = "every event signed"
    if unsigned_age is not None:
        unsigned = f"oldest unsigned event {_ago(unsigned_age)}"
    return [
        Check(
            "beat",
            sweep_age is not None and sweep_age <= sweep_limit,
            f"last sweep {_ago(sweep_age)} (red after {sweep_limit} s)",
            facts.last_sweep_at,
        ),
        Check(
            "workers",
            facts.lookup_lag <= lookup_limit,
            f"last lookup finished {_ago(lookup_age)}; the most overdue lookup has waited "
            f"{facts.lookup_lag:.0f} s (red after {lookup_limit} s)",
            facts.last_lookup_at,
        ),
        Check(
            "webhook deliveries",
            facts.webhook_lag <= webhook_limit,
            f"{facts.webhook_backlog} pending; the longest-waiting due message has waited "
            f"{facts.webhook_lag:.0f} s for a worker of queue {settings.SETTLE_WEBHOOK_QUEUE} "
            f"(red after {webhook_limit} s)",
            facts.oldest_due_webhook_at,
        ),
        Check(
            "audit checkpoint",
            unsigned_age is None or unsigned_age <= checkpoint_limit,
            f"newest signed {_ago(checkpoint_age)}; {unsigned} "
            f"(red when an event waits {checkpoint_limit} s unsigned)",
            facts.newest_checkpoint_at,
        ),
        _verification_check(facts),
        Check(
            "audit alarms",
            facts.open_alarms == 0,
            f"{facts.open_alarms} open audit alarms"
            + (
                ""
                if facts.checkpoint_file_problem is None
                else f"; checkpoint file incomplete: {facts.checkpoint_file_problem}"
            ),
        ),
    ]


def _verification_check(facts: HealthFacts) -> Check:
    """Red when the newest verification found a problem, or the routine or the full
    verification is late (nothing verified since its threshold, once something was
    signed that long ago)."""
    late = settings.SETTLE_AUDIT_VERIFY_LATE_SECONDS
    full_late = settings.SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS
    signed_age = facts.age(facts.first_checkpoint_at, facts.now)

    def on_time(age: float | None, limit: int) -> bool:
        if age is not None:
            return age <= limit
        return signed_age is None or signed_age <= limit

    routine_ok = on_time(facts.verified_age, late)
    full_ok = on_time(facts.full_verified_age, full_late)
    job = ""
    if facts.full_job is not None:
        job = f", a job running ({facts.full_job[0]} events in {facts.full_job[1]} slices)"
    detail = (
        f"last found intact {_ago(facts.verified_age)} (red after {late} s); fully "
        f"{_ago(facts.full_verified_age)} (red after {full_late} s){job}"
    )
    if facts.verified_age is None and routine_ok:
        # Green and "never" together read as a contradiction: say why it is not late.
        detail = (
            "not verified yet, and not due: the first verification follows the first signed "
            f"checkpoint (red {late} s after it if none ran){job}"
        )
    if facts.verify_problem is not None:
        detail = f"problem found: {facts.verify_problem}; {detail}"
    return Check(
        "audit verification",
        facts.verify_problem is None and routine_ok and full_ok,
        detail,
        facts.verified_at,
    )


def status_checks() -> list[Check]:
    """Every check of the status page, the database's first: without it the rest are red."""
    database = _database_check()
    checks = [database, _broker_check()]
    if not database.ok:
        return [*checks, Check("facts", False, "not read: the database is unreachable")]
    try:
        return checks + _fact_checks(health_facts())
    except DatabaseError as exc:
        logger.exception("status: reading the health facts failed")
        return [*checks, Check("facts", False, f"not read: {type(exc).__name__}")]
