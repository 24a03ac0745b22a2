"""The approver's side: the pending approvals a console user may decide, and one approval's
page.

decidable
    Pending and not past its ``expires_at`` (``approvals.selectors.decidable_now``,
    whether or not the sweep has closed it yet); of a provider on which the user holds
    ``decide_approvals``; one the policy lets the user decide
    (``approvals.selectors.approvals_with_standing``: not their own proposal, from the
    groups it named); not one the user has voted on already (a person decides once); and
    not one the customer alone decides (``customer``: staff read it on its page, and
    cannot stand in, ``customer_required``).

The deciding service checks again (``recovery.services.permits.approval_decision``):
this is what the console offers, not what makes a decision valid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.models import (
    Count,
    Exists,
    IntegerField,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils.text import Truncator

from approvals.models import Approval, ApprovalVote
from approvals.selectors import approvals_with_standing, decidable_now
from common.actors import Actor
from policies.services import policies_at
from policies.summaries import action_summary
from recovery.models import Operation
from recovery.params_diff import params_rows
from recovery.permissions import ProviderPermission
from recovery.selectors.access import providers_for_user, providers_visible_to

INBOX_SHOWN = 200  # the oldest; an inbox longer than this is worked from the top
SUMMARY_CHARS = 90
EARLIER_SHOWN = 10


def approvals_decidable(*, user: Any) -> QuerySet[Approval]:
    """The pending approvals ``user`` may decide now (see the module's ``decidable``)."""
    if not user.is_authenticated or not user.is_active:
        return Approval.objects.none()
    providers = providers_for_user(user=user, permissions=(ProviderPermission.DECIDE_APPROVALS,))
    # By identity, not by name: a vote cast before a rename is still the user's.
    voted = ApprovalVote.objects.filter(
        approval=OuterRef("pk"), voter_identity=Actor.of("user", user).identity
    )
    return (
        approvals_with_standing(user=user)
        .filter(
            decidable_now(),
            provider__in=providers.values("name"),
            in_groups=True,
            by_proposer=False,
        )
        .exclude(Exists(voted))
        .exclude(customer=Approval.Customer.CUSTOMER)
    )


@dataclass(frozen=True)
class InboxFilters:
    provider: str = ""
    action: str = ""  # the start of the action's name
    host: str = ""


@dataclass(frozen=True)
class InboxRow:
    approval: Approval
    summary: str  # the parameters on one line, cut short
    approvals: int  # approving votes so far
    sentence: str = ""  # the action in plain words, cut short; empty: the policy has none

    @property
    def quorum(self) -> str:
        """``1 of 2``, when more than one person must approve; else empty."""
        if self.approval.required <= 1:
            return ""
        return f"{self.approvals} of {self.approval.required}"


def params_summary(params_canonical: str | None) -> str:
    """``amount=1250 · currency=EUR · to="acct-7"``: every leaf, cut at a line's length."""
    if params_canonical is None:
        return ""
    rows = params_rows(json.loads(params_canonical), [])
    text = " · ".join(f"{row.path}={row.value}" for row in rows)
    return Truncator(text).chars(SUMMARY_CHARS)


def _approving_votes() -> Coalesce:
    votes = (
        ApprovalVote.objects.filter(approval=OuterRef("pk"), approve=True)
        .order_by()
        .values("approval")
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(votes, output_field=IntegerField()), Value(0))


def approvals_inbox(*, user: Any, filters: InboxFilters) -> tuple[list[InboxRow], bool]:
    """What ``user`` may decide, oldest first, each with its parameters' summary and
    its action in plain words; and whether there are more than ``INBOX_SHOWN``.

    One statement: the operation's parameters and the votes are subqueries by
    operation key and approval; and one more for the policies the approvals opened
    under, when this process has not read them yet.
    """
    approvals = approvals_decidable(user=user)
    if filters.provider:
        approvals = approvals.filter(provider=filters.provider)
    if filters.action:
        approvals = approvals.filter(action__startswith=filters.action)
    if filters.host:
        approvals = approvals.filter(host__startswith=filters.host)
    params = Operation.objects.filter(key=OuterRef("operation_key")).values("params_canonical")
    found = list(
        approvals.annotate(
            params_canonical=Subquery(params[:1]), approving=_approving_votes()
        ).order_by("created_at", "id")[: INBOX_SHOWN + 1]
    )
    found, more = found[:INBOX_SHOWN], len(found) > INBOX_SHOWN
    # The versions they opened under: kept by each process, so a statement only when
    # one was applied since this process last read them.
    policies = policies_at({approval.policy_version for approval in found})
    rows = []
    for approval in found:
        canonical = approval.params_canonical
        summary = action_summary(
            policies[approval.policy_version],
            approval.provider,
            approval.action,
            None if canonical is None else json.loads(canonical),
        )
        rows.append(
            InboxRow(
                approval,
                params_summary(approval.params_canonical),
                approval.approving,
                Truncator(summary.sentence).chars(SUMMARY_CHARS),
            )
        )
    return rows, more


def approval_decidable_by(*, user: Any, approval: Approval) -> bool:
    return approvals_decidable(user=user).filter(pk=approval.pk).exists()


def approval_proposed_by(*, user: Any, approval: Approval) -> bool:
    """Whether ``user`` is the person the host named as the approval's proposer."""
    if not approval.proposer:
        return False
    standing = approvals_with_standing(user=user).filter(pk=approval.pk)
    return standing.filter(by_proposer=True).exists()  # type: ignore[misc]


def operations_earlier(*, user: Any, operation: Operation) -> list[Operation]:
    """The host's latest operations with the same action before this one, that ``user``
    may view: what an approver compares the action with."""
    return list(
        Operation.objects.filter(
            host_id=operation.host_id,
            action=operation.action,
            provider__in=providers_visible_to(user=user),
        )
        .exclude(pk=operation.pk)
        .only("key", "state", "created_at")
        .order_by("-created_at", "-id")[:EARLIER_SHOWN]
    )
