"""Who counts in a decision: one person one vote whatever their name, the proposer a
person rather than a text, and two accounts of one person (same e-mail) one vote."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals.models import Approval, ApprovalVote, Approver
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of
from policies.services import policy_apply
from recovery.services.errors import RecoveryError
from recovery.services.permits import approval_decision
from tests.support.console import console_user
from tests.support.flow import PARAMS, Flow

pytestmark = pytest.mark.django_db

QUORUM = b"""
[[rules]]
name = "two"
outcome = "quorum"
approvals = 2
"""


@pytest.fixture
def quorum(db: None) -> None:
    policy_apply(source=QUORUM, actor=Actor.system("test"))


def _open(flow: Flow, key: str = "op-1", **body: Any) -> str:
    flow.register(key)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals", body or None)
    assert response.status_code == 201, response.content
    approval_id: str = response.json()["approval_id"]
    return approval_id


def _vote(user: User, approval_id: str, approve: bool = True) -> Approval:
    approval, _ = approval_decision(
        approval_id=approval_id,  # type: ignore[arg-type]
        approve=approve,
        ttl_seconds=300,
        decided_by=Actor.of("user", user),
        reviewed_digest=digest_of(PARAMS),
    )
    return approval


def _refused(user: User, approval_id: str) -> str:
    with pytest.raises(RecoveryError) as refused:
        _vote(user, approval_id)
    return refused.value.code.value


def _rename(user: User, username: str) -> User:
    user.username = username
    user.save(update_fields=["username"])
    return User.objects.get(pk=user.pk)


# -- one person, one vote, whatever their name -------------------------------------------


def test_a_person_renamed_between_votes_is_still_one_vote(flow: Flow, quorum: None, provider):
    ann = console_user("ann", "decide_approvals", provider)
    approval_id = _open(flow)
    assert _vote(ann, approval_id).status == "pending"
    ann = _rename(ann, "ann2")
    assert _refused(ann, approval_id) == "already_voted"
    assert Approval.objects.get(pk=approval_id).status == "pending"
    assert ApprovalVote.objects.count() == 1
    assert AuditEvent.objects.filter(kind="decision_refused", data__code="already_voted").exists()


def test_an_approver_credential_renamed_between_votes_is_still_one_vote(flow: Flow, quorum: None):
    approval_id = _open(flow)
    decision = {"decision": "approve", "params_digest": digest_of(PARAMS)}
    path = f"/api/v1/approvals/{approval_id}/decision"
    assert flow.approver_api.post(path, decision).json()["status"] == "pending"
    Approver.objects.update(name="renamed-desk")
    again = flow.approver_api.post(path, decision)
    assert (again.status_code, again.json()["error"]) == (409, "already_voted")
    assert Approval.objects.get(pk=approval_id).status == "pending"


# -- the proposer is a person ------------------------------------------------------------


def test_a_proposer_named_in_another_case_is_the_same_person(flow: Flow, provider):
    ann = console_user("ann", "decide_approvals", provider)
    approval_id = _open(flow, proposer="Ann")
    assert Approval.objects.get(pk=approval_id).proposer_user_id == ann.pk
    assert _refused(ann, approval_id) == "proposer_excluded"
    refused = AuditEvent.objects.get(kind="decision_refused")
    assert refused.data["code"] == "proposer_excluded"
    assert not ApprovalVote.objects.exists()


def test_a_proposer_renamed_after_the_opening_is_still_the_proposer(flow: Flow, provider):
    ann = console_user("ann", "decide_approvals", provider)
    approval_id = _open(flow, proposer="ann")
    ann = _rename(ann, "ann2")
    assert _refused(ann, approval_id) == "proposer_excluded"
    # Another person who takes the name is not the one the host named.
    newcomer = console_user("ann", "decide_approvals", provider)
    assert newcomer.pk != ann.pk
    assert _vote(newcomer, approval_id).status == "approved"


def test_a_proposer_settle_does_not_know_yet_is_excluded_once_they_arrive(flow: Flow, provider):
    approval_id = _open(flow, proposer="zoe@fleet")
    assert Approval.objects.get(pk=approval_id).proposer_user_id is None
    zoe = console_user("Zoe@Fleet", "decide_approvals", provider)
    assert _refused(zoe, approval_id) == "proposer_excluded"


# -- two accounts of one person ----------------------------------------------------------


def test_the_proposers_break_glass_account_is_the_proposer_too(flow: Flow, provider):
    directory = console_user("ann", "decide_approvals", provider)
    break_glass = console_user("admin-ann", "decide_approvals", provider)
    User.objects.filter(pk=directory.pk).update(email="ann@example.com")
    User.objects.filter(pk=break_glass.pk).update(email="ANN@example.com", is_superuser=True)
    approval_id = _open(flow, proposer="ann")
    assert _refused(User.objects.get(pk=break_glass.pk), approval_id) == "proposer_excluded"
    assert not ApprovalVote.objects.exists()


def test_a_break_glass_account_with_the_directorys_e_mail_is_the_same_person(
    flow: Flow, quorum: None, provider
):
    directory = console_user("ann", "decide_approvals", provider)
    break_glass = console_user("admin-ann", "decide_approvals", provider)
    User.objects.filter(pk=directory.pk).update(email="ann@example.com")
    User.objects.filter(pk=break_glass.pk).update(email="Ann@Example.com", is_superuser=True)
    approval_id = _open(flow)
    assert _vote(directory, approval_id).status == "pending"
    assert _refused(break_glass, approval_id) == "already_voted"
    assert Approval.objects.get(pk=approval_id).status == "pending"
    assert ApprovalVote.objects.count() == 1
    refused = AuditEvent.objects.get(kind="decision_refused")
    assert refused.actor == Actor.of("user", break_glass)
    assert refused.data["code"] == "already_voted"


def test_people_without_an_e_mail_are_not_one_person(flow: Flow, quorum: None, provider):
    ann = console_user("ann", "decide_approvals", provider)
    ben = console_user("ben", "decide_approvals", provider)
    assert ann.email == ben.email == ""
    approval_id = _open(flow)
    _vote(ann, approval_id)
    assert _vote(ben, approval_id).status == "approved"
