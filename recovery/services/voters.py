"""Who an approval's policy lets count: the checks a vote passes before it is recorded.

staff
    A person or approver: not the proposer, from the approval's ``groups`` if it names
    any, signing with a passkey where the policy requires it (``staff_voter_check``).
customer
    An approval addressed to the customer (``Approval.customer``) counts its party's
    vote and, for ``customer_and_staff``, one staff vote beside it; neither stands in
    for the other (``customer_voter_check``).

Each check refuses through the deciding service's ``refuse``, which records the refusal
on the operation's chain before raising it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from django.contrib.auth import get_user_model

from approvals.models import Approval, ApprovalVote
from approvals.selectors import approvals_with_standing
from common.actors import Actor
from common.errors import ErrorCode

Refuse = Callable[..., NoReturn]


def customer_voter_check(
    approval: Approval, voter: Actor, signature: dict[str, Any] | None, refuse: Refuse
) -> None:
    """Refuse a vote on a customer approval that would not be the customer's or the one
    staff vote beside it; a staff vote is then held to the staff rules (``voter_check``)."""
    if voter.kind == "party":
        if approval.customer_passkey and not signature:
            refuse(
                ErrorCode.PASSKEY_REQUIRED,
                "this decision must be signed with your passkey",
                {},
            )
        return
    if approval.customer == Approval.Customer.CUSTOMER:
        refuse(ErrorCode.CUSTOMER_REQUIRED, ErrorCode.CUSTOMER_REQUIRED.message, {})
    staff_voted = ApprovalVote.objects.filter(approval=approval).exclude(
        voter_identity__startswith="party:"
    )
    if staff_voted.exclude(voter_identity=voter.identity).exists():
        refuse(
            ErrorCode.CUSTOMER_REQUIRED,
            "a member of staff has decided already; the customer's decision is awaited",
            {},
        )


def staff_voter_check(
    approval: Approval,
    voter: Actor,
    signature: dict[str, Any] | None,
    refuse: Refuse,
) -> None:
    """Refuse a voter the approval's policy does not let count (its rules are
    ``approvals.selectors.approvals_with_standing``'s, which the inbox filters on)."""
    by_proposer, in_groups = False, not approval.groups
    if voter.kind == "user" and (approval.proposer or approval.groups):
        user = get_user_model().objects.filter(pk=voter.id).first()
        if user is not None:
            by_proposer, in_groups = (
                approvals_with_standing(user=user)
                .filter(pk=approval.pk)
                # The stubs know the model's fields, not the annotations.
                .values_list("by_proposer", "in_groups")  # type: ignore[misc]
                .get()
            )
    if by_proposer:
        refuse(ErrorCode.PROPOSER_EXCLUDED, "the proposer may not decide it", {})
    if not in_groups:
        refuse(
            ErrorCode.NOT_IN_GROUP,
            f"it needs a person from {', '.join(approval.groups)}",
            {"groups": approval.groups},
        )
    if approval.passkey_required and not signature:
        refuse(ErrorCode.PASSKEY_REQUIRED, "this decision must be signed with a passkey", {})
