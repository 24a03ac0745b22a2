"""The object permissions on a provider: each codename, named once.

view_operations
    See the provider's operations, their evidence and history; without it they do not
    exist for the user (404).
lookup_operations
    Ask for a lookup of the evidence now, and claim or release an operation.
confirm_operations, void_operations, repair_operations
    Take that decision at once where the evidence backs it.
propose_reconciliations
    Propose what the evidence does not back, for a second operator.
approve_reconciliations
    Approve or reject another operator's proposal.
decide_approvals
    Approve or deny an operation's exact action (as an approver would).

A console user holds them per provider (django-guardian), through a role
(``recovery.services.roles``); the services check them (``recovery.services.access``).
``Provider.Meta.permissions`` is this enum's ``choices``, so the codenames in the
database are exactly these. Imports nothing of Settle: the models import it.
"""

from __future__ import annotations

from django.db import models


class ProviderPermission(models.TextChoices):
    # The order is the model's Meta order, which its migrations recorded.
    VIEW_OPERATIONS = "view_operations", "May view this provider's operations"
    LOOKUP_OPERATIONS = (
        "lookup_operations",
        "May look up evidence for this provider's operations",
    )
    CONFIRM_OPERATIONS = "confirm_operations", "May confirm this provider's operations"
    REPAIR_OPERATIONS = "repair_operations", "May repair stranded receipts of this provider"
    VOID_OPERATIONS = "void_operations", "May void this provider's operations"
    PROPOSE_RECONCILIATIONS = (
        "propose_reconciliations",
        "May propose a reconciliation for four-eyes approval",
    )
    APPROVE_RECONCILIATIONS = (
        "approve_reconciliations",
        "May approve another operator's reconciliation",
    )
    DECIDE_APPROVALS = "decide_approvals", "May approve or deny this provider's actions"

    @property
    def perm(self) -> str:
        """The name ``has_perm`` and guardian's shortcuts take: ``recovery.<codename>``."""
        return f"recovery.{self.value}"


# What lets a person act on a provider's operations in bulk, beyond viewing them: any of
# these (``bulk.services.ACTION_PERMISSIONS`` asks each action's own).
ACTING_PERMISSIONS = (
    ProviderPermission.LOOKUP_OPERATIONS,
    ProviderPermission.CONFIRM_OPERATIONS,
    ProviderPermission.VOID_OPERATIONS,
    ProviderPermission.PROPOSE_RECONCILIATIONS,
)
