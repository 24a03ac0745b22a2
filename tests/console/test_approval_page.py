"""One approval's page: exactly what will run, who has decided, and deciding it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.models import Approval, ApprovalVote, Permit
from audit.models import AuditEvent
from common.actors import Actor
from recovery.models import Operation
from tests.support.audit import sign_again_recorded
from tests.support.console import console_user, pending_approval
from tests.support.flow import PARAMS, Flow

pytestmark = pytest.mark.django_db

NESTED = {
    "amount": 1250,
    "beneficiary": {"name": "Ada", "accounts": [{"iban": "DE89 3704"}, {"iban": "FR76 3000"}]},
    "memo": "m" * 300,
}


@pytest.fixture
def decider(provider) -> User:
    return console_user("dora", "decide_approvals", provider)


@pytest.fixture
def approval(flow) -> Approval:
    return pending_approval(
        flow,
        "pay-1",
        params=NESTED,
        rule="large-payment",
        rule_reason="amount over 1000 EUR",
        policy_version="sha256:" + "b" * 64,
        required=2,
        expires_at=timezone.now() + timedelta(hours=1, seconds=5),
    )


def _page(client: Client, approval: Approval) -> str:
    response = client.get(f"/approvals/{approval.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _decide(client: Client, approval: Approval, **data: str):
    digest = Operation.objects.get(key=approval.operation_key).params_digest
    return client.post(
        f"/approvals/{approval.pk}/decide", {"params_digest": digest, **data}, follow=True
    )


def _notices(response) -> str:
    return " ".join(re.findall(r'<li class="notice [^"]*">([^<]*)</li>', response.content.decode()))


def _vote(approval: Approval, user: User, *, approve: bool, reason: str = "", signed=False):
    return ApprovalVote.objects.create(
        approval=approval,
        voter=Actor.of("user", user),
        voter_identity=Actor.of("user", user).identity,
        approve=approve,
        reason=reason,
        params_digest=approval.params_digest,
        at=timezone.now(),
        signature={"assertion": "…"} if signed else {},
    )


# -- what the page shows -----------------------------------------------------------------


def test_the_page_shows_every_parameter_nested_and_the_digest(signed_in, decider, approval):
    html = _page(signed_in(decider), approval)
    operation = Operation.objects.get(key="pay-1")
    for path, value in [
        ("amount", "1250"),
        ("beneficiary.name", "&quot;Ada&quot;"),
        ("beneficiary.accounts.0.iban", "&quot;DE89 3704&quot;"),
        ("beneficiary.accounts.1.iban", "&quot;FR76 3000&quot;"),
    ]:
        assert (
            f'<th scope="row"><code>{path}</code></th><td><code class="wrap">{value}</code>' in html
        )
    # A long value is folded, not cut: all of it is in the page.
    assert '<details class="long">' in html and "(302 characters: show all)" in html
    assert f"&quot;{'m' * 300}&quot;" in html
    assert operation.params_digest in html
    assert f'name="params_digest" value="{operation.params_digest}"' in html
    assert ">payment.send<" in html and ">orders<" in html and ">fleet-a<" in html
    assert 'href="/operations/pay-1/"' in html
    assert "expires <time" in html and "in 1 h" in html


def test_the_page_shows_the_rule_that_asked_and_the_quorum(signed_in, decider, approval):
    html = _page(signed_in(decider), approval)
    assert (
        '<a href="/policy/#rule-large-payment"><strong>large-payment</strong></a>: '
        "amount over 1000 EUR"
    ) in html
    assert '2 people to approve: <span class="badge quorum">0 of 2</span>' in html


def test_without_a_rule_one_person_decides(signed_in, decider, flow):
    html = _page(signed_in(decider), pending_approval(flow, "op-1"))
    assert "No policy rule: one person decides." in html
    assert "one person's approval" in html


def test_the_votes_so_far_with_reasons_and_signatures(signed_in, decider, supervisor, approval):
    _vote(approval, supervisor, approve=True, reason="checked the invoice", signed=True)
    html = _page(signed_in(decider), approval)
    votes = html[html.index("Decided so far") : html.index("Your decision")]
    assert '<span class="badge vote-approve">approved</span> sam' in votes
    assert "checked the invoice" in votes and ">signed<" in votes
    assert '<span class="badge quorum">1 of 2</span>' in html


def test_one_who_voted_sees_their_vote_and_no_form(signed_in, decider, approval):
    _vote(approval, decider, approve=True)
    html = _page(signed_in(decider), approval)
    assert "dora (you)" in html and "You have decided: it waits for 1 more approval." in html
    assert "/decide" not in html


def test_the_hosts_latest_operations_of_the_same_action(signed_in, decider, approval, flow):
    for n in range(12):
        flow.register(f"old-{n:02}", {"n": n})
    html = _page(signed_in(decider), approval)
    latest = html[html.index('id="earlier-title"') :]
    keys = re.findall(r'<a class="key" href="/operations/([^/]+)/">', latest)
    assert keys == [f"old-{n:02}" for n in range(11, 1, -1)]  # the latest ten, newest first
    assert "state-awaiting_approval" in latest


def test_the_page_costs_the_same_statements_however_many_votes_and_operations(
    signed_in, decider, supervisor, approval, flow, django_assert_max_num_queries
):
    client = signed_in(decider)
    _page(client, approval)
    with django_assert_max_num_queries(12) as captured:
        _page(client, approval)
    few = len(captured)  # a later request resets what the context saw
    _vote(approval, supervisor, approve=True)
    for n in range(12):
        flow.register(f"old-{n:02}", {"n": n})
    with django_assert_max_num_queries(few):
        _page(client, approval)


# -- who sees it, who decides ------------------------------------------------------------


def test_an_outsider_gets_404_for_the_page_and_the_decision(signed_in, approval, other_provider):
    outsider = console_user("oscar", "decide_approvals", other_provider)
    client = signed_in(outsider)
    assert client.get(f"/approvals/{approval.pk}/").status_code == 404
    assert _decide(client, approval, decision="approve").status_code == 404
    assert client.get("/approvals/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_viewer_sees_the_page_without_the_form_and_may_not_post(signed_in, viewer, approval):
    client = signed_in(viewer)
    html = _page(client, approval)
    assert "large-payment" in html and "/decide" not in html
    assert "You may see this approval but not decide it." in html
    assert _decide(client, approval, decision="approve").status_code == 403
    assert _decide(client, approval, decision="deny").status_code == 403  # no reason either
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert Operation.objects.get(key="pay-1").state == "awaiting_approval"


def test_the_proposer_sees_the_page_without_the_form(signed_in, decider, flow):
    mine = pending_approval(flow, "op-1", proposer="dora")
    html = _page(signed_in(decider), mine)
    assert "You asked for this action: someone else decides it." in html
    assert "/decide" not in html


def test_a_group_restricted_approval_has_no_form_outside_its_groups(signed_in, decider, flow):
    restricted = pending_approval(flow, "op-1", groups=["treasury"])
    html = _page(signed_in(decider), restricted)
    assert "members of treasury" in html and "/decide" not in html


# -- deciding ----------------------------------------------------------------------------


def test_approving_through_the_page_issues_a_permit(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    response = _decide(signed_in(decider), approval, decision="approve")
    assert response.redirect_chain == [(f"/approvals/{approval.pk}/", 302)]
    assert "Approved: a permit is issued for 5 min" in _notices(response)
    assert Operation.objects.get(key="op-1").state == "approved"
    assert Approval.objects.get(pk=approval.pk).status == "approved"
    kinds = list(AuditEvent.objects.filter(operation_key="op-1").values_list("kind", flat=True))
    assert "permit_issued" in kinds and kinds[-1] == "transition"
    event = AuditEvent.objects.filter(operation_key="op-1").last()
    assert event is not None and event.actor == Actor.of("user", decider)


def test_denying_through_the_page_with_a_reason(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    response = _decide(signed_in(decider), approval, decision="deny", reason="not ours")
    assert "Denied: the operation will not run." in _notices(response)
    assert Operation.objects.get(key="op-1").state == "denied"
    assert AuditEvent.objects.filter(operation_key="op-1", kind="transition").exists()


def test_a_denial_without_a_reason_decides_nothing(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    response = _decide(signed_in(decider), approval, decision="deny", reason="  ")
    assert "Nothing was decided: give a reason to deny." in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "pending"


def test_a_stale_digest_is_refused_with_its_code_and_nothing_changes(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    client = signed_in(decider)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "params_digest": "sha256:" + "0" * 64},
        follow=True,
    )
    assert response.status_code == 200
    assert "Refused (digest_mismatch)" in _notices(response)
    assert "Nothing changed." in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert Operation.objects.get(key="op-1").state == "awaiting_approval"
    refused = AuditEvent.objects.get(operation_key="op-1", kind="decision_refused")
    assert refused.data["code"] == "digest_mismatch"


def test_deciding_what_is_decided_already_is_refused_with_its_code(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    client = signed_in(decider)
    _decide(client, approval, decision="deny", reason="no")
    response = _decide(client, approval, decision="approve")
    assert response.status_code == 200
    assert "Refused (" in _notices(response)
    assert Operation.objects.get(key="op-1").state == "denied"


def _past_due(flow: Flow, key: str) -> Approval:
    """Opened five seconds ago with a one-second expiry; no sweep has run since."""
    with time_machine.travel(timezone.now() - timedelta(seconds=5)):
        return pending_approval(flow, key, expires_at=timezone.now() + timedelta(seconds=1))


def test_an_expired_approval_cannot_be_approved_through_the_page(signed_in, decider, flow):
    approval = _past_due(flow, "op-1")
    client = signed_in(decider)
    assert "/decide" not in _page(client, approval)  # not offered
    response = _decide(client, approval, decision="approve")
    assert response.status_code == 200
    assert "Refused (approval_expired)" in _notices(response)
    assert "It is closed as expired." in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "expired"
    assert Operation.objects.get(key="op-1").state == "expired"
    assert not Permit.objects.exists()
    refused = AuditEvent.objects.get(operation_key="op-1", kind="decision_refused")
    assert refused.data["code"] == "approval_expired"


def test_a_get_of_the_decision_is_not_allowed(signed_in, decider, approval):
    assert signed_in(decider).get(f"/approvals/{approval.pk}/decide").status_code == 405


def test_the_page_works_for_another_hosts_approval(
    signed_in, decider, other_host_api, approver_api, provider
):
    approval = pending_approval(Flow(other_host_api, approver_api, provider), "op-b", params=PARAMS)
    assert ">fleet-b<" in _page(signed_in(decider), approval)


# -- a quorum, and who the policy lets count ---------------------------------------------


def test_a_quorum_is_reached_through_the_page_by_two_people(
    signed_in, decider, supervisor, approval
):
    first = _decide(signed_in(decider), approval, decision="approve", reason="looks right")
    assert "Your approval is recorded (1 of 2): it waits for 1 more." in _notices(first)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert Operation.objects.get(key="pay-1").state == "awaiting_approval"
    vote = ApprovalVote.objects.get(approval=approval)
    assert vote.voter == Actor.of("user", decider) and vote.reason == "looks right"
    assert AuditEvent.objects.filter(operation_key="pay-1", kind="approval_voted").exists()
    # Gone from the first person's inbox, still in the second's.
    assert str(approval.pk) not in signed_in(decider).get("/approvals/").content.decode()
    assert str(approval.pk) in signed_in(supervisor).get("/approvals/").content.decode()
    second = _decide(signed_in(supervisor), approval, decision="approve")
    assert "Approved: a permit is issued" in _notices(second)
    assert Operation.objects.get(key="pay-1").state == "approved"
    html = _page(signed_in(supervisor), approval)
    assert "dora" in html and "sam (you)" in html and "looks right" in html


def test_voting_twice_is_refused_with_its_code(signed_in, decider, approval):
    client = signed_in(decider)
    _decide(client, approval, decision="approve")
    again = _decide(client, approval, decision="approve")
    assert "Refused (already_voted)" in _notices(again)
    assert ApprovalVote.objects.filter(approval=approval).count() == 1


def test_one_denial_denies_a_quorum_approval(signed_in, decider, approval):
    response = _decide(signed_in(decider), approval, decision="deny", reason="wrong account")
    assert "Denied" in _notices(response)
    assert Operation.objects.get(key="pay-1").state == "denied"


def test_the_reason_of_a_single_decision_is_kept_and_shown(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    _decide(signed_in(decider), approval, decision="deny", reason="not ours")
    assert Approval.objects.get(pk=approval.pk).decision_reason == "not ours"
    html = _page(signed_in(decider), approval)
    assert '<span class="badge vote-deny">denied</span> dora' in html and "not ours" in html


@pytest.mark.parametrize(
    ("policy", "code"),
    [
        ({"proposer": "dora"}, "proposer_excluded"),
        ({"groups": ["treasury"]}, "not_in_group"),
        ({"passkey_required": True}, "passkey_required"),
    ],
)
def test_a_decision_the_policy_does_not_count_is_refused_with_its_code(
    signed_in, decider, flow, policy, code
):
    approval = pending_approval(flow, "op-1", **policy)
    response = _decide(signed_in(decider), approval, decision="approve")
    assert response.status_code == 200
    assert f"Refused ({code})" in _notices(response) and "Nothing changed." in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not ApprovalVote.objects.filter(approval=approval).exists()


def test_a_passkey_policy_tells_a_person_without_one_how_to_register(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1", passkey_required=True)
    html = _page(signed_in(decider), approval)
    assert "each decision must be signed with a passkey" in html
    assert "you have none yet" in html and 'href="/accounts/2fa/webauthn/add/"' in html
    assert 'value="approve"' not in html  # no unsigned decision is offered


def test_signing_starts_only_for_a_person_who_may_decide_and_has_a_passkey(
    signed_in, decider, viewer, flow
):
    approval = pending_approval(flow, "op-1", passkey_required=True)
    path = f"/approvals/{approval.pk}/sign"
    refused = signed_in(decider).post(path, {"decision": "approve"})
    assert (refused.status_code, refused.json()["error"]) == (409, "no_passkey")
    assert refused.json()["register"] == "/accounts/2fa/webauthn/add/"
    assert signed_in(viewer).post(path, {"decision": "approve"}).json()["error"] == "forbidden"
    assert signed_in(decider).post(path, {"decision": "maybe"}).status_code == 422


def test_a_signed_answer_the_page_never_asked_for_decides_nothing(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1", passkey_required=True)
    response = signed_in(decider).post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "params_digest": approval.params_digest, "credential": "{}"},
        follow=True,
    )
    assert "Refused (signature_invalid)" in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    sign_again_recorded("op-1", decider, "approval", approval_id=str(approval.pk))


def test_an_incomplete_form_decides_nothing(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    response = signed_in(decider).post(
        f"/approvals/{approval.pk}/decide", {"decision": "approve"}, follow=True
    )
    assert "Nothing was decided: the form was incomplete" in _notices(response)
    assert Approval.objects.get(pk=approval.pk).status == "pending"
