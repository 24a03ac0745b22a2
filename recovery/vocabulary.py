"""The words the audit log is written in: every event's kind, and the codes inside them.

The stored strings are the values, and each event's hash covers them: a value is never
renamed. Every ``audit_append`` names a member; the console's filter list and the
operation page's timeline read these lists, so a kind added here is offered there.

AuditKind
    What an audit event records (its ``kind``).
StaleSignal
    Why a ``stale_signal`` event was recorded instead of applied (its ``signal``).
WaitReason
    Why an operation waits in the console's queue, read from its last transition.
"""

from __future__ import annotations

from django.db import models


class AuditKind(models.TextChoices):
    # An operation's life, in order.
    REGISTERED = "registered", "Registered"
    TRANSITION = "transition", "State changed"
    APPROVAL_REQUESTED = "approval_requested", "Approval requested"
    DECISION_REFUSED = "decision_refused", "Decision refused"
    PERMIT_ISSUED = "permit_issued", "Permit issued"
    PERMIT_REVOKED = "permit_revoked", "Permit revoked"
    PERMIT_REVOKE_IGNORED = "permit_revoke_ignored", "Permit revocation ignored"
    PERMIT_CONSUMED = "permit_consumed", "Permit consumed"
    CONSUME_REFUSED = "consume_refused", "Permit consumption refused"
    HOST_REPORT = "host_report", "Host report"
    EVIDENCE = "evidence", "Evidence"
    RECEIPT_RECOVERED = "receipt_recovered", "Receipt recovered"
    LOOKUP_ABANDONED = "lookup_abandoned", "Lookup abandoned"
    STALE_SIGNAL = "stale_signal", "Stale signal"
    # Operators.
    CLAIMED = "claimed", "Claimed"
    CLAIM_RELEASED = "claim_released", "Claim released"
    OPERATOR_ACTION = "operator_action", "Operator action"
    OPERATOR_REFUSED = "operator_refused", "Operator action refused"
    RECONCILIATION_PROPOSED = "reconciliation_proposed", "Reconciliation proposed"
    RECONCILIATION_APPROVED = "reconciliation_approved", "Reconciliation approved"
    RECONCILIATION_REJECTED = "reconciliation_rejected", "Reconciliation rejected"
    RECONCILIATION_INVALIDATED = "reconciliation_invalidated", "Reconciliation invalidated"
    # Bulk work: the batch itself, on the system chain (each item is on its operation's).
    BULK_SUBMITTED = "bulk_submitted", "Bulk action submitted"
    BULK_APPROVED = "bulk_approved", "Bulk void approved"
    BULK_REJECTED = "bulk_rejected", "Bulk void rejected"
    # The system chain: configuration and access.
    PROVIDER_CONFIGURED = "provider_configured", "Provider configured"
    PERMISSION_GRANTED = "permission_granted", "Permission granted"
    CREDENTIAL_ROTATED = "credential_rotated", "Credential rotated"
    CREDENTIAL_DISABLED = "credential_disabled", "Credential disabled"
    CREDENTIAL_ENABLED = "credential_enabled", "Credential enabled"
    AUDIT_EXPORTED = "audit_exported", "Audit trail exported"
    AUDIT_ALARM_RESOLVED = "audit_alarm_resolved", "Audit alarm resolved"
    WEBHOOK_CONFIGURED = "webhook_configured", "Webhook endpoint configured"
    WEBHOOK_REDELIVERED = "webhook_redelivered", "Webhook redelivered"
    ALERT_RULE_CONFIGURED = "alert_rule_configured", "Alert rule configured"


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
