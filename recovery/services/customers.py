"""A host's customer (a party) in an approval: named at opening, deciding by link.

party
    The host names the person on each opening (``PartyNamed``); one ``Party`` row per
    (host, party) is written or refreshed in one statement (``party_upsert``), and the
    approval names it. Only the host that named it and staff who may view the provider
    see it.
customer approval
    One whose policy terms ask the customer (``Approval.customer``): it is decided by
    votes, the party's counting for the customer and, for ``customer_and_staff``, one
    staff vote beside it. Staff cannot stand in for the customer, nor the customer for
    staff: the party votes once, and a second staff vote is ``customer_required``.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from django.conf import settings

from approvals.models import Approval, ApprovalVote, Party
from common.actors import Actor
from common.errors import ErrorCode
from dbsql.writes import upsert
from recovery.services.errors import NotFound, RecoveryError

Refuse = Callable[..., NoReturn]


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


def party_upsert(*, host: str, named: PartyNamed) -> Party:
    """The host's party ``named``, made or refreshed with its latest name and contact."""
    party = Party(host=host, party=named.id, display_name=named.name, contact=named.contact)
    upsert(party, conflict=("host", "party"), update=("display_name", "contact", "updated_at"))
    return party


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


def party_vote_record(voter: Actor, signature: dict[str, Any] | None) -> dict[str, Any]:
    """What the audit log adds to a party's vote: how they decided."""
    if voter.kind != "party":
        return {}
    return {"party": voter.name, "method": "passkey" if signature else "link"}
