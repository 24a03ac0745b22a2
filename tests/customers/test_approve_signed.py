"""A customer signs their decision with their passkey on the approval link's page, where
the policy asks for it (customer_passkey): the statement is Settle's, the passkey must be
this party's own, and a refusal decides nothing and is on the operation's chain."""

from __future__ import annotations

import json

import pytest
from django.core import signing

from approvals.models import Approval, ApprovalVote
from approvals.services.parties import (
    party_enrolment_request,
    party_passkey_enrol,
    party_passkey_remove,
)
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from common.actors import Actor
from customers.passkeys import SIGN_SALT
from harness.webauthn import SoftPasskey
from tests.support.customers import Page, customer_open, customer_policy_apply

pytestmark = pytest.mark.django_db
SIGNED_PARAMS = {"amount": 9000, "currency": "EUR", "to": "acct-7"}
HOST = Actor("host", "1", "fleet-a")


def _enrol(party: str, key: SoftPasskey, host: str = "fleet-a"):
    _, token = party_enrolment_request(host=host, party=party, actor=HOST)
    return party_passkey_enrol(token=token, credential_id=key.id, public_key=key.public_key)


@pytest.fixture
def opened(flow):
    customer_policy_apply()
    return customer_open(flow, params=SIGNED_PARAMS)


@pytest.fixture
def page(opened) -> Page:
    return Page(opened["approval_id"], HTTP_HOST="localhost:8000")


def _signed(page: Page, decision: str, key: SoftPasskey, *, signs: str | None = None):
    """Ask for the options, sign the statement with ``key`` (the statement of ``signs``,
    if given) and send the decision."""
    begun = page.post("/approve/sign", decision=signs or decision)
    assert begun.status_code == 200, begun.content
    options = begun.json()
    statement = signing.loads(options["statement"], salt=SIGN_SALT)
    credential = key.assertion(statement)
    approval = Approval.objects.get()
    return page.post(
        "/approve/decide",
        decision=decision,
        params_digest=approval.params_digest,
        credential=json.dumps(credential),
        statement=options["statement"],
    )


def test_the_customers_signed_approval_approves_and_verifies(opened, page):
    key = SoftPasskey()
    _enrol("cust_8812", key)
    assert Approval.objects.get().customer_passkey
    answer = _signed(page, "approve", key)
    assert answer.status_code == 200, answer.content
    assert Approval.objects.get().status == "approved"
    vote = ApprovalVote.objects.get()
    assert vote.signature["credential_id"] == key.id
    voted = AuditEvent.objects.get(kind=AuditKind.APPROVAL_VOTED)
    assert voted.actor.kind == "party" and voted.data["signature"]["credential_id"] == key.id
    assert list(audit_verify()) == []


def test_the_options_name_only_the_partys_passkeys_and_the_exact_action(opened, page):
    mine = SoftPasskey()
    _enrol("cust_8812", mine)
    _enrol("cust_other", SoftPasskey())
    options = page.post("/approve/sign", decision="approve").json()
    assert [c["id"] for c in options["publicKey"]["allowCredentials"]] == [mine.id]
    statement = signing.loads(options["statement"], salt=SIGN_SALT)
    approval = Approval.objects.get()
    assert statement["approval_id"] == str(approval.pk)
    assert statement["params_digest"] == approval.params_digest
    assert statement["operation_key"] == "op-1" and statement["decision"] == "approve"
    assert statement["person"].startswith(f"party:{approval.party_id}:")


def test_a_second_phone_not_enrolled_for_this_party_signs_nothing(opened, page):
    _enrol("cust_8812", SoftPasskey())
    other_phone = SoftPasskey()
    _enrol("cust_other", other_phone)
    answer = _signed(page, "approve", other_phone)
    assert answer.status_code == 403
    assert 'data-code="party_passkey_unknown"' in answer.content.decode()
    assert Approval.objects.get().status == "pending" and not ApprovalVote.objects.exists()
    refused = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert refused.operation_key == "op-1" and refused.actor.kind == "party"
    assert refused.data["code"] == "party_passkey_unknown"


def test_a_passkey_of_the_same_party_id_at_another_host_signs_nothing(opened, page):
    _enrol("cust_8812", SoftPasskey())
    elsewhere = SoftPasskey()
    _enrol("cust_8812", elsewhere, host="fleet-b")
    assert _signed(page, "approve", elsewhere).status_code == 403
    assert Approval.objects.get().status == "pending"


def test_a_signature_of_the_other_decision_decides_nothing(opened, page):
    key = SoftPasskey()
    _enrol("cust_8812", key)
    answer = _signed(page, "approve", key, signs="deny")
    assert answer.status_code == 403
    assert 'data-code="signature_invalid"' in answer.content.decode()
    assert Approval.objects.get().status == "pending"


def test_an_unsigned_decision_is_refused_where_the_policy_asks_for_a_passkey(opened, page):
    _enrol("cust_8812", SoftPasskey())
    answer = page.decide("approve", Approval.objects.get().params_digest)
    assert 'data-code="passkey_required"' in answer.content.decode()
    assert Approval.objects.get().status == "pending"


def test_a_party_without_a_passkey_is_told_to_ask_the_hosts_app(opened, page):
    state = page.state().content.decode()
    assert 'data-code="party_no_passkey"' in state and "Ask the app" in state
    assert "data-decide" not in state
    begun = page.post("/approve/sign", decision="approve")
    assert begun.status_code == 409 and 'data-code="party_no_passkey"' in begun.content.decode()


def test_a_removed_passkey_leaves_the_party_without_one(opened, page):
    passkey = _enrol("cust_8812", SoftPasskey())
    assert "data-sign" in page.state().content.decode()
    party_passkey_remove(party=passkey.party, passkey_id=passkey.pk, actor=HOST)
    assert 'data-code="party_no_passkey"' in page.state().content.decode()


def test_a_decided_approval_gives_no_signing_options(opened, page):
    key = SoftPasskey()
    _enrol("cust_8812", key)
    _signed(page, "approve", key)
    begun = page.post("/approve/sign", decision="deny")
    assert begun.status_code == 409 and 'data-code="already_decided"' in begun.content.decode()


def test_signing_options_without_the_pages_csrf_token_are_refused(opened, page):
    _enrol("cust_8812", SoftPasskey())
    answer = page.client.post(
        "/approve/sign", {"token": page.token, "decision": "approve"}, HTTP_HOST="localhost:8000"
    )
    assert answer.status_code == 403 and 'data-code="csrf_failed"' in answer.content.decode()
