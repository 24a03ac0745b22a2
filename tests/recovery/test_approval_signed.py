"""A person's decision signed with their passkey: counted where a passkey is required,
and refused, on the record, when what was signed is not this very decision."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from guardian.shortcuts import assign_perm

from approvals.models import Approval, ApprovalVote
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.statements import statement
from harness.webauthn import RP_ID, SoftPasskey, passkey_register
from identity.passkey_signing import signed_record_verify
from recovery.models import Operation
from recovery.permissions import ProviderPermission as P
from recovery.services.errors import RecoveryError
from recovery.services.permits import approval_decision
from tests.support.flow import Flow

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending(flow: Flow) -> Approval:
    """An approval whose policy asks for a passkey's signature."""
    flow.register()
    flow.host_api.post("/api/v1/operations/op-1/approvals")
    Approval.objects.update(passkey_required=True, voting=True)
    return Approval.objects.get()


@pytest.fixture
def decider(provider) -> User:
    user = User.objects.create_user("sam")
    assign_perm(P.DECIDE_APPROVALS.perm, user, provider)
    return user


@pytest.fixture
def passkey(decider: User) -> SoftPasskey:
    key = SoftPasskey()
    passkey_register(decider, key)
    return key


def _signed(approval: Approval, user: User, passkey: SoftPasskey, **changed: str) -> Any:
    """The record the console keeps once the person's passkey signed the statement."""
    fields = {
        "approval_id": str(approval.pk),
        "operation_key": approval.operation_key,
        "params_digest": approval.params_digest,
        "decision": "approve",
        "person": Actor.of("user", user).stored,
        **changed,
    }
    signed = statement("approval", **fields)
    if signed["person"] != Actor.of("user", user).stored:  # identity signs only one's own
        return passkey.record(signed)
    return signed_record_verify(
        user=user, statement=signed, assertion_json=passkey.assertion(signed), rp_id=RP_ID
    )


def _decide(approval: Approval, person: User, signature: Any, approve: bool = True) -> Any:
    return approval_decision(
        approval_id=approval.pk,
        approve=approve,
        ttl_seconds=60,
        decided_by=Actor.of("user", person),
        reviewed_digest=approval.params_digest,
        signature=signature,
    )


def test_a_signed_vote_decides_an_approval_that_requires_a_passkey(pending, decider, passkey):
    with pytest.raises(RecoveryError) as unsigned:
        _decide(pending, decider, None)
    assert unsigned.value.code == "passkey_required"

    record = _signed(pending, decider, passkey)
    approval, permit = _decide(pending, decider, record)
    assert approval.status == "approved" and permit is not None
    assert Operation.objects.get().state == "approved"
    assert ApprovalVote.objects.get().signature == record
    voted = AuditEvent.objects.get(kind=AuditKind.APPROVAL_VOTED)
    assert voted.data["signature"] == record
    assert voted.actor == Actor.of("user", decider)


@pytest.mark.parametrize(
    "changed",
    [
        {"params_digest": "sha256:" + "b" * 64},
        {"decision": "deny"},
        {"approval_id": "00000000-0000-0000-0000-000000000000"},
        {"operation_key": "op-2"},
        {"person": "user:999:someone-else"},
    ],
)
def test_a_signature_of_another_decision_is_refused_and_recorded(
    pending, decider, passkey, changed
):
    record = _signed(pending, decider, passkey, **changed)
    with pytest.raises(RecoveryError) as refused:
        _decide(pending, decider, record)
    assert refused.value.code == "signature_invalid"
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert not ApprovalVote.objects.exists()
    event = AuditEvent.objects.get(kind=AuditKind.DECISION_REFUSED)
    assert event.data == {"approval_id": str(pending.pk), "code": "signature_invalid"}
    assert event.actor == Actor.of("user", decider)


def test_a_signed_denial_must_be_given_as_a_denial(pending, decider, passkey):
    denial = _signed(pending, decider, passkey, decision="deny")
    with pytest.raises(RecoveryError) as refused:
        _decide(pending, decider, denial, approve=True)
    assert refused.value.code == "signature_invalid"
    approval, permit = _decide(
        pending, decider, _signed(pending, decider, passkey, decision="deny"), approve=False
    )
    assert approval.status == "denied" and permit is None
