"""The codes inside the operation core's audit events (``audit.kinds`` has their kinds).

The stored strings are the values, and each event's hash covers them: a value is never
renamed.

StaleSignal
    Why a ``stale_signal`` event was recorded instead of applied (its ``signal``).
WaitReason
    Why an operation waits in the console's queue, read from its last transition.
"""

from __future__ import annotations

from django.db import models


class StaleSignal(models.TextChoices):
    # From the worker holding (or having held) the dispatch.
    STALE_FENCING_TOKEN = "stale_fencing_token", "Stale fencing token"
    HEARTBEAT_AFTER_LEASE = "heartbeat_after_lease", "Heartbeat after the lease lapsed"
    REPORT_AFTER_LEASE = "report_after_lease", "Report after the lease lapsed"
    DUPLICATE_REPORT = "duplicate_report", "Duplicate report"
    # From the provider.
    EVIDENCE_EARLY = "evidence_early", "Evidence before dispatch"
    EVIDENCE_AFTER_SETTLEMENT = "evidence_after_settlement", "Evidence after settlement"
    STALE_CALLBACK_SEQUENCE = "stale_callback_sequence", "Stale callback sequence"
    CALLBACK_AFTER_SETTLEMENT = "callback_after_settlement", "Callback after settlement"
    # From Settle itself.
    LOOKUP_SUPERSEDED = "lookup_superseded", "Lookup superseded"
    TRANSITION_REFUSED = "transition_refused", "Transition refused"


class WaitReason(models.TextChoices):
    """The values are the transition's own words (its event, verdict or reason)."""

    LEASE_LOST = "lease_lost", "Worker's lease lapsed"
    MISMATCH = "mismatch", "Evidence mismatch"
    CORRUPT = "corrupt", "Evidence corrupt"
    CONFLICT = "conflict", "Evidence contradicts the worker's report"
    LOOKUP_BUDGET_SPENT = "lookup_budget_spent", "Lookups inconclusive, budget spent"
    STRANDED = "stranded", "Receipt still running"
