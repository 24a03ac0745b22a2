"""The customer decides as the party an approval is addressed to (``Actor.party``)."""

from __future__ import annotations

import pytest

from approvals.models import Approval, ApprovalVote, Party
from audit.models import AuditEvent
from common import statements
from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Operation
from recovery.services.errors import RecoveryError
from recovery.services.permits import approval_decision
from tests.support.console import console_user
from tests.support.customers import PARTY, customer_open, customer_policy_apply
from tests.support.flow import PARAMS


@pytest.fixture
def policy(db):
    customer_policy_apply()


def _decide(approval, actor, approve=True, **more):
    return approval_decision(
        approval_id=approval.id,
        approve=approve,
        ttl_seconds=300,
        decided_by=actor,
        reviewed_digest=approval.params_digest,
        **more,
    )


def _refusals(code):
    return AuditEvent.objects.filter(kind="decision_refused", data__code=code).count()


def test_the_party_approves_its_own_approval_and_the_operation_moves(flow, policy):
    opened = customer_open(flow)
    approval = Approval.objects.get(pk=opened["approval_id"])
    party = Party.objects.get(host="fleet-a", party=PARTY["id"])
    decided, permit = _decide(approval, Actor.party(party))
    assert decided.status == "approved" and permit is not None
    assert Operation.objects.get(key="op-1").state == "approved"
    voted = AuditEvent.objects.get(kind="approval_voted")
    assert voted.actor == Actor.party(party)
    assert voted.data["method"] == "link" and voted.data["party"] == "fleet-a/cust_8812"


def test_another_party_finds_no_such_approval(flow, policy):
    approval = Approval.objects.get(pk=customer_open(flow)["approval_id"])
    other = Party.objects.create(host="fleet-a", party="cust_other")
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, Actor.party(other))
    assert refused.value.code == ErrorCode.UNKNOWN_APPROVAL
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not ApprovalVote.objects.exists()


def test_a_party_finds_no_approval_that_is_not_addressed_to_the_customer(flow, db):
    flow.register("op-1")
    body = {"party": PARTY}
    opened = flow.host_api.post("/api/v1/operations/op-1/approvals", body).json()
    assert "link" not in opened and opened["party"]["id"] == PARTY["id"]
    approval = Approval.objects.get(pk=opened["approval_id"])
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, Actor.party(approval.party))
    assert refused.value.code == ErrorCode.UNKNOWN_APPROVAL


def test_staff_cannot_stand_in_for_the_customer(flow, policy, provider):
    approval = Approval.objects.get(pk=customer_open(flow)["approval_id"])
    supervisor = console_user("sam", "supervisor", provider)
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, Actor.of("user", supervisor))
    assert refused.value.code == ErrorCode.CUSTOMER_REQUIRED
    assert _refusals("customer_required") == 1
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_an_unsigned_decision_on_a_customer_passkey_approval_is_refused(flow, policy):
    opened = customer_open(flow, params={**PARAMS, "amount": 9000})
    approval = Approval.objects.get(pk=opened["approval_id"])
    assert approval.customer_passkey and approval.rule == "signed-by-customer"
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, Actor.party(approval.party))
    assert refused.value.code == ErrorCode.PASSKEY_REQUIRED
    assert _refusals("passkey_required") == 1
    assert not ApprovalVote.objects.exists()


def test_a_signature_counts_only_if_it_signs_this_decision_as_this_party(flow, policy):
    opened = customer_open(flow, params={**PARAMS, "amount": 9000})
    approval = Approval.objects.get(pk=opened["approval_id"])
    party = Actor.party(approval.party)
    subject = statements.approval_subject(
        approval_id=approval.pk,
        operation_key=approval.operation_key,
        params_digest=approval.params_digest,
    )
    as_someone_else = statements.statement(
        "approval", subject, decision="approve", person="party:999:fleet-a/x"
    )
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, party, signature={"statement": as_someone_else})
    assert refused.value.code == ErrorCode.SIGNATURE_INVALID
    # The caller verified the passkey; the service checks that it signs this decision.
    signed = statements.statement("approval", subject, decision="approve", person=party.stored)
    decided, permit = _decide(approval, party, signature={"statement": signed})
    assert decided.status == "approved" and permit is not None
    voted = AuditEvent.objects.get(kind="approval_voted")
    assert voted.data["method"] == "passkey"
    assert voted.data["signature"] == {"statement": signed}


def test_the_second_tap_is_told_it_is_already_decided(flow, policy):
    approval = Approval.objects.get(pk=customer_open(flow)["approval_id"])
    party = Actor.party(approval.party)
    _decide(approval, party)
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, party, approve=False)
    assert refused.value.code == ErrorCode.ALREADY_DECIDED
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    assert _refusals("already_decided") == 1


def test_customer_and_staff_needs_both_and_either_declines(flow, policy, provider):
    params = {**PARAMS, "currency": "GBP"}
    approval = Approval.objects.get(pk=customer_open(flow, params=params)["approval_id"])
    assert approval.customer == "customer_and_staff" and approval.required == 2
    party = Actor.party(approval.party)
    olivia = Actor.of("user", console_user("olivia2", "supervisor", provider))
    sam = Actor.of("user", console_user("sam2", "supervisor", provider))
    decided, permit = _decide(approval, olivia)
    assert decided.status == "pending" and permit is None
    # A second member of staff cannot stand in for the customer.
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, sam)
    assert refused.value.code == ErrorCode.CUSTOMER_REQUIRED
    decided, permit = _decide(approval, party)
    assert decided.status == "approved" and permit is not None


def test_customer_and_staff_the_customer_declines_alone(flow, policy, provider):
    params = {**PARAMS, "currency": "GBP"}
    approval = Approval.objects.get(pk=customer_open(flow, params=params)["approval_id"])
    decided, permit = _decide(approval, Actor.party(approval.party), approve=False, reason="no")
    assert decided.status == "denied" and permit is None
    assert Operation.objects.get(key="op-1").state == "denied"


def test_a_party_cannot_decide_as_staff_too(flow, policy):
    params = {**PARAMS, "currency": "GBP"}
    approval = Approval.objects.get(pk=customer_open(flow, params=params)["approval_id"])
    party = Actor.party(approval.party)
    decided, _ = _decide(approval, party)
    assert decided.status == "pending"
    with pytest.raises(RecoveryError) as refused:
        _decide(approval, party)
    assert refused.value.code == ErrorCode.ALREADY_DECIDED
    assert Approval.objects.get(pk=approval.pk).status == "pending"
