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

import logging
import socket
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any

from celery import current_app
from django.conf import settings

from approvals.models import Approval, ApprovalVote, Party
from common.actors import Actor
from common.errors import ErrorCode
from common.links import approval_link_url
from common.notify import apprise_notify
from common.outbound import address_refused
from recovery.models import Host
from recovery.services.errors import NotFound, RecoveryError

logger = logging.getLogger(__name__)


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


def party_link_publish(approval_id: uuid.UUID) -> None:
    """Queue the sending of an approval's link to its party (after the opening commits);
    a broker that does not take it is logged: the host has the link in its answer."""
    try:
        current_app.send_task(
            "recovery.tasks.party_link_send",
            args=[str(approval_id)],
            queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        )
    except Exception as exc:  # the broker's errors vary by transport
        logger.warning("publishing the party link of %s failed: %r", approval_id, exc)


def _address_allowed(contact: str) -> bool:
    """Whether every address the contact's server resolves to may be called
    (``common.outbound``): never a private one unless the operator allows it."""
    if settings.SETTLE_PARTY_NOTIFY_ALLOW_PRIVATE:
        return True
    host = urllib.parse.urlsplit(contact).hostname or ""
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and not any(address_refused(str(address)) for address in found)


def party_link_send(*, approval_id: uuid.UUID) -> bool:
    """Send a pending customer approval's link to its party's contact through Apprise;
    whether it went. Only to a contact the operator's settings allow now, at an address
    the outbound checks let through; anything else is logged and sends nothing."""
    approval = (
        Approval.objects.select_related("party")
        .filter(pk=approval_id, status=Approval.Status.PENDING)
        .exclude(customer="")
        .first()
    )
    if approval is None or approval.party is None or not approval.party.contact:
        return False
    contact = approval.party.contact
    if not contact_allowed(contact) or not _address_allowed(contact):
        logger.warning("the party link of %s was not sent: contact not allowed", approval_id)
        return False
    host = Host.objects.filter(name=approval.host).first()
    asker = host.shown_name if host is not None else approval.host
    expires = (
        f" It expires at {approval.expires_at:%Y-%m-%d %H:%M} UTC." if approval.expires_at else ""
    )
    sent = apprise_notify(
        urls=[contact],
        title=f"{asker} asks for your approval",
        body=f"{asker} asks you to approve an action: {approval_link_url(approval.id)}{expires}",
    )
    if not sent:
        logger.warning("the party link of %s was not delivered", approval_id)
    return sent
