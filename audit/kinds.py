"""What an audit event records: every event's ``kind``, from every part of Settle.

The stored strings are the values, and each event's hash covers them: a value is never
renamed. Every ``audit_append`` names a member; the console's filter list and the
operation page's timeline read this list, so a kind added here is offered there.
"""

from __future__ import annotations

from django.db import models


class AuditKind(models.TextChoices):
    # An operation's life, in order.
    REGISTERED = "registered", "Registered"
    TRANSITION = "transition", "State changed"
    APPROVAL_REQUESTED = "approval_requested", "Approval requested"
    APPROVAL_VOTED = "approval_voted", "Person decided"
    DECISION_REFUSED = "decision_refused", "Decision refused"
    # A passkey's answer to a statement that did not hold, on the chain of the
    # operation it names (a bulk batch's: the system chain).
    SIGNATURE_REFUSED = "signature_refused", "Passkey signature refused"
    APPROVAL_EXPIRED = "approval_expired", "Approval expired"
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
    BULK_REFUSED = "bulk_refused", "Bulk decision refused"
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
    POLICY_APPLIED = "policy_applied", "Approval policy applied"
    # The system chain: who signed in to the console, how, and with which roles.
    SIGNED_IN = "signed_in", "Signed in"
    SIGNED_OUT = "signed_out", "Signed out"
    SIGN_IN_FAILED = "sign_in_failed", "Sign-in failed"
    SIGN_IN_REFUSED = "sign_in_refused", "Sign-in refused"
    ROLES_SYNCED = "roles_synced", "Roles synced from the directory"
    SESSIONS_ENDED = "sessions_ended", "Sessions ended"
    # A session held until its person uses a passkey (SETTLE_REQUIRE_PASSKEY_FOR) tried
    # to act, or to read through the API.
    PASSKEY_HOLD_REFUSED = "passkey_hold_refused", "Refused until a passkey is used"
    PASSKEY_ADDED = "passkey_added", "Passkey registered"
    PASSKEY_REMOVED = "passkey_removed", "Passkey removed"
    # A host's customer (a party) and their passkeys, enrolled through the host's app.
    PARTY_ENROLMENT_REQUESTED = "party_enrolment_requested", "Customer passkey enrolment requested"
    PARTY_PASSKEY_ADDED = "party_passkey_added", "Customer passkey enrolled"
    PARTY_PASSKEY_REMOVED = "party_passkey_removed", "Customer passkey removed"
