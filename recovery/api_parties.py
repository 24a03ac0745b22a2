"""The host API's parties: a customer's passkey enrolment link, their passkeys, revoking one.

A host names its customer by its own stable id (``party``); it sees only its own
parties (``approvals.services.parties.party_for_host``). Thin views, as in
``recovery.api``: parse, authenticate, one service, answer.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from approvals.models import Party, PartyPasskey
from approvals.services import parties
from common.errors import ErrorCode
from recovery import contract, contract_parties
from recovery.api import Caller, _answer, _json_body, _raw_body, api_view
from recovery.contract import ApiError
from recovery.services.customers import PartyNamed, party_contact_check

PARTY_PATTERN = re.compile(contract.PARTY_PATTERN)


def _host_party(caller: Caller, party: str) -> Party:
    """The caller's party ``party`` (``unknown_party`` for another host's, or none)."""
    assert caller.host is not None
    if not PARTY_PATTERN.fullmatch(party):
        raise ApiError(ErrorCode.UNKNOWN_PARTY, "no such party for this host")
    return parties.party_for_host(host=caller.host.name, party=party)


def enrolment_url(token: str) -> str:
    """The enrolment page with ``token`` in its fragment: never sent to a server by the
    browser, so never in an access log or a ``Referer``."""
    return f"{settings.SETTLE_CUSTOMER_URL}{reverse('customer-enrol')}#{token}"


def passkey_record(passkey: PartyPasskey) -> contract_parties.PartyPasskeyRecord:
    return contract_parties.PartyPasskeyRecord(
        id=passkey.pk,
        name=passkey.name,
        created_at=passkey.created_at.isoformat(),
        removed_at=passkey.removed_at.isoformat() if passkey.removed_at else None,
    )


@api_view(methods=("POST",), auth=("host",))
def party_enrolments(request: HttpRequest, caller: Caller, party: str) -> HttpResponse:
    """A one-time passkey enrolment link for the party (made if the host names it first)."""
    assert caller.host is not None
    if not PARTY_PATTERN.fullmatch(party):
        raise ApiError(
            ErrorCode.INVALID_FIELD,
            "party: letters, digits and ._:@~- (at most 100), from a letter or digit",
            field="party",
        )
    body = contract_parties.EnrolmentRequest()
    if _raw_body(request):
        body = contract.parse(contract_parties.EnrolmentRequest, _json_body(request))
    # A contact is kept only where Settle may send to it, as when an approval names one.
    party_contact_check(PartyNamed(id=party, name=body.name, contact=body.contact))
    enrolment, token = parties.party_enrolment_request(
        host=caller.host.name,
        party=party,
        actor=caller.actor,
        display_name=body.name,
        contact=body.contact,
    )
    link = contract_parties.EnrolmentLink(
        url=enrolment_url(token), expires_at=enrolment.expires_at.isoformat(), party=party
    )
    return _answer(link, status=201)


@api_view(methods=("GET",), auth=("host",))
def party_detail(request: HttpRequest, caller: Caller, party: str) -> HttpResponse:
    """The party and its passkeys, removed ones included (oldest first)."""
    row = _host_party(caller, party)
    passkeys = PartyPasskey.objects.filter(party=row).order_by("created_at", "pk")
    record = contract_parties.PartyPasskeys(
        party=row.party,
        display_name=row.display_name,
        passkeys=[passkey_record(passkey) for passkey in passkeys],
    )
    return _answer(record)


@api_view(methods=("DELETE",), auth=("host",))
def party_passkey_revoke(
    request: HttpRequest, caller: Caller, party: str, passkey_id: str
) -> HttpResponse:
    """Revoke one of the party's passkeys: it signs nothing from now on."""
    row = _host_party(caller, party)
    if not (passkey_id.isascii() and passkey_id.isdigit() and len(passkey_id) <= 18):
        raise ApiError(ErrorCode.UNKNOWN_PASSKEY, "no such passkey of this party")
    passkey, removed = parties.party_passkey_remove(
        party=row, passkey_id=int(passkey_id), actor=caller.actor
    )
    removal = contract_parties.PasskeyRemoved(passkey=passkey_record(passkey), removed=removed)
    return _answer(removal)
