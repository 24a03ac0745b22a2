"""Reads that start from the caller: a host, an approver or a console user.

Each ``*_for_*`` selector returns only what that caller may see; views, services and the
console start every query from one of them, so a check cannot be forgotten in one place.
One module per concern, every public name re-exported here:

- ``access``: who may see what — the providers, operations and approvals a host, an
  approver or a console user may read, and who supervises the audit trail;
- ``records``: the API objects built from rows (approval, permit, evidence, operation);
- ``queue``: the console's queue — filters, pages, counts;
- ``jump``: the one operation a key, an id or a provider's reference names;
- ``operation_page``: one operation's timeline, permit history, lookup in flight, and
  what differs between intended action, evidence and receipt;
- ``reconciliations``: the four-eyes proposals waiting for a second operator;
"""

from __future__ import annotations

from recovery.selectors.access import (
    UserRoles,
    approval_for_caller,
    approvals_for_approver,
    approvals_for_user,
    audit_alarms_for_user,
    operation_for_user,
    operations_for_approver,
    operations_for_host,
    provider_for_callback,
    provider_permissions,
    provider_permissions_all,
    providers_for_user,
    providers_supervised,
    providers_visible_to,
    supervises_any_provider,
    user_roles,
)
from recovery.selectors.jump import operation_jump_for_user
from recovery.selectors.operation_page import (
    TIMELINE_LIMIT,
    Comparison,
    OperationPage,
    OperationViewed,
    PermitHistory,
    Timeline,
    TimelineEntry,
    lookup_in_flight,
    operation_comparison,
    operation_page,
    operation_permit_history,
    operation_timeline,
    operation_viewed_for_user,
    permit_history_older,
)
from recovery.selectors.queue import (
    QUEUE_AGES,
    QUEUE_COUNT_CAP,
    QUEUE_REASONS,
    QUEUE_STRANDED,
    QueueFilters,
    QueuePage,
    QueueRow,
    operations_queue_counts_for_user,
    operations_queue_for_user,
)
from recovery.selectors.reconciliations import (
    RECONCILIATIONS_SHOWN,
    ProposalRow,
    reconciliation_request_for_user,
    reconciliation_requests_for_user,
)
from recovery.selectors.records import (
    approval_needs,
    approval_record,
    evidence_record,
    newest_permit,
    operation_record,
    operations_params_canonical,
    permit_history_page,
    permit_record,
)

__all__ = [
    "QUEUE_AGES",
    "QUEUE_COUNT_CAP",
    "QUEUE_REASONS",
    "QUEUE_STRANDED",
    "RECONCILIATIONS_SHOWN",
    "TIMELINE_LIMIT",
    "Comparison",
    "OperationPage",
    "OperationViewed",
    "PermitHistory",
    "ProposalRow",
    "QueueFilters",
    "QueuePage",
    "QueueRow",
    "Timeline",
    "TimelineEntry",
    "UserRoles",
    "approval_for_caller",
    "approval_needs",
    "approval_record",
    "approvals_for_approver",
    "approvals_for_user",
    "audit_alarms_for_user",
    "evidence_record",
    "lookup_in_flight",
    "newest_permit",
    "operation_comparison",
    "operation_for_user",
    "operation_jump_for_user",
    "operation_page",
    "operation_permit_history",
    "operation_record",
    "operation_timeline",
    "operation_viewed_for_user",
    "operations_for_approver",
    "operations_for_host",
    "operations_params_canonical",
    "operations_queue_counts_for_user",
    "operations_queue_for_user",
    "permit_history_older",
    "permit_history_page",
    "permit_record",
    "provider_for_callback",
    "provider_permissions",
    "provider_permissions_all",
    "providers_for_user",
    "providers_supervised",
    "providers_visible_to",
    "reconciliation_request_for_user",
    "reconciliation_requests_for_user",
    "supervises_any_provider",
    "user_roles",
]
