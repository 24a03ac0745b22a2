"""What the customer's page shows of an approval: who asks, the action in plain words,
every parameter and the digest, the expiry, and how it stands."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from approvals.models import Approval, Party
from approvals.services.approvals import approval_expired
from common.errors import ErrorCode
from policies.services import policy_at
from policies.summaries import Summary, action_summary
from recovery.models import Host, Operation
from recovery.services.errors import NotFound

# A customer's permit lasts as long as the rule says, else as a person's by default.
DEFAULT_PERMIT_SECONDS = 300


@dataclass(frozen=True)
class ApprovalPage:
    approval: Approval
    party: Party
    asker: str
    summary: Summary
    params_digest: str
    expires_at: datetime | None
    # "pending", "expired", "approved", "denied", "cancelled"; ``voted``: the customer
    # decided a customer_and_staff approval still waiting for staff.
    stage: str
    voted: str = ""


def customer_approval(*, approval_id: uuid.UUID, locale: str = "en") -> ApprovalPage:
    """The approval a link names, as its customer sees it (``link_invalid`` if it is not
    addressed to a customer: such a link was never given)."""
    approval = (
        Approval.objects.select_related("party")
        .filter(pk=approval_id, party__isnull=False)
        .exclude(customer="")
        .first()
    )
    if approval is None or approval.party is None:
        raise NotFound(ErrorCode.LINK_INVALID)
    canonical = (
        Operation.objects.filter(key=approval.operation_key)
        .values_list("params_canonical", flat=True)
        .first()
    )
    params: Any = json.loads(canonical) if canonical else {}
    host = Host.objects.filter(name=approval.host).first()
    policy = policy_at(approval.policy_version)
    summary = action_summary(policy, approval.provider, approval.action, params, locale=locale)
    stage = str(approval.status)
    if approval_expired(approval=approval):
        stage = "expired"
    voted = ""
    if stage == "pending":
        vote = approval.votes.filter(voter_identity=f"party:{approval.party.pk}").first()
        if vote is not None:
            voted = "approve" if vote.approve else "deny"
    return ApprovalPage(
        approval=approval,
        party=approval.party,
        asker=host.shown_name if host is not None else approval.host,
        summary=summary,
        params_digest=approval.params_digest,
        expires_at=approval.expires_at,
        stage=stage,
        voted=voted,
    )


def customer_permit_seconds(*, approval: Approval) -> int:
    """How long the permit a customer's approval issues lasts: its rule's ``permit_ttl``."""
    policy = policy_at(approval.policy_version)
    rule = next((rule for rule in policy.rules if rule.name == approval.rule), None)
    return int(rule.permit_ttl.total_seconds()) if rule else DEFAULT_PERMIT_SECONDS
