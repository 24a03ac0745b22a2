"""A host's customer (a party) in an approval: named at opening, deciding by link.

party
    The host names the person on each opening (``PartyNamed``); one ``Party`` row per
    (host, party) is written or refreshed by the approval's own insert (``party_row``):
    on PostgreSQL one statement for both. Only the host that named it and staff who may
    view the provider see it.
customer approval
    One whose policy terms ask the customer (``Approval.customer``): it is decided by
    votes, the party's counting for the customer and, for ``customer_and_staff``, one
    staff vote beside it. Staff cannot stand in for the customer, nor the customer for
    staff: the party votes once, and a second staff vote is ``customer_required``.
"""

from __future__ import annotations

import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from approvals.models import Approval, ApprovalVote, Party
from common.actors import Actor
from common.errors import ErrorCode
from recovery.services.errors import NotFound, RecoveryError


@dataclass(frozen=True)
class PartyNamed:
    """The customer as the host names them when it opens an approval."""

    id: str
    name: str = ""
    contact: str = ""


def contact_allowed(contact: str) -> bool:
    """Whether Settle may send a link to ``contact``: an Apprise URL whose scheme and
    server are both in the operator's ``SETTLE_PARTY_NOTIFY_SCHEMES`` and
    ``SETTLE_PARTY_NOTIFY_HOSTS`` (empty: none is)."""
    try:
        parts = urllib.parse.urlsplit(contact)
        host = (parts.hostname or "").lower()
    except ValueError:
        return False
    return (
        parts.scheme.lower() in settings.SETTLE_PARTY_NOTIFY_SCHEMES
        and bool(host)
        and host in settings.SETTLE_PARTY_NOTIFY_HOSTS
    )


def party_contact_check(party: PartyNamed | None) -> None:
    """Refuse a contact the operator does not let Settle send to (``contact_not_allowed``)."""
    if party is not None and party.contact and not contact_allowed(party.contact):
        raise RecoveryError(
            ErrorCode.CONTACT_NOT_ALLOWED,
            "the party's contact is not a scheme and server this Settle sends links to; "
            "leave it out and deliver the link yourself",
        )


def party_row(*, host: str, named: PartyNamed) -> Party:
    """The host's party ``named`` as an unsaved row: the approval's insert makes or
    refreshes it (``approvals.services.approvals.approval_request``)."""
    return Party(host=host, party=named.id, display_name=named.name, contact=named.contact)


def party_decision_require(*, approval_id: uuid.UUID, party: Actor) -> None:
    """To any party but the one it is addressed to, an approval does not exist."""
    addressed = (
        Approval.objects.filter(pk=approval_id, party_id=int(party.id))
        .exclude(customer="")
        .exists()
        if party.id.isdigit()
        else False
    )
    if not addressed:
        raise NotFound(ErrorCode.UNKNOWN_APPROVAL, "no such approval")


def approval_opened_data(approval: Approval) -> dict[str, Any]:
    """What ``approval.opened`` says of an approval addressed to the customer. Its link
    is not stored with it: the webhook's sender adds it (``webhooks.outbox``)."""
    party = approval.party
    assert party is not None
    return {
        "approval_id": str(approval.id),
        "party": {"id": party.party, "name": party.display_name},
        "expires_at": approval.expires_at.isoformat() if approval.expires_at else None,
    }


def party_decision_data(approval: Approval) -> dict[str, Any]:
    """What a decided customer approval's change adds for ``approval.decided``: the party,
    and, once they decided, how (``method``: "link" or "passkey") and when."""
    if not approval.customer or approval.party_id is None:
        return {}
    party = Party.objects.filter(pk=approval.party_id).values_list("party", "display_name")
    found = party.first()
    if found is None:
        return {}
    data: dict[str, Any] = {"party": {"id": found[0], "name": found[1]}}
    vote = ApprovalVote.objects.filter(
        approval_id=approval.pk, voter_identity=f"party:{approval.party_id}"
    ).first()
    if vote is not None:
        data["party_decision"] = "approve" if vote.approve else "deny"
        data["method"] = "passkey" if vote.signature else "link"
        data["decided_at"] = vote.at.isoformat()
    return data


def party_vote_record(voter: Actor, signature: dict[str, Any] | None) -> dict[str, Any]:
    """What the audit log adds to a party's vote: how they decided."""
    if voter.kind != "party":
        return {}
    return {"party": voter.name, "method": "passkey" if signature else "link"}
