"""The approvals inbox: the pending approvals a console user may decide, and nothing else."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.utils import timezone

from approvals.models import Approval, ApprovalVote
from common.actors import Actor
from console.selectors.approvals import InboxFilters, approvals_inbox, params_summary
from tests.support.console import console_user, pending_approval
from tests.support.flow import Flow

pytestmark = pytest.mark.django_db


def _listed(response) -> list[str]:
    """The approval ids listed, in order."""
    assert response.status_code == 200
    return re.findall(r'<tr data-href="/approvals/([0-9a-f-]+)/">', response.content.decode())


@pytest.fixture
def decider(provider) -> User:
    """Holds only the role that decides approvals, on ``orders``."""
    return console_user("dora", "decide_approvals", provider)


def test_a_decider_sees_what_waits_oldest_first_with_its_parameters(signed_in, decider, flow):
    newer = pending_approval(flow, "op-new")
    older = pending_approval(flow, "op-old", params={"amount": 99, "to": {"iban": "DE01"}})
    Approval.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(hours=2))
    page = signed_in(decider).get("/approvals/")
    assert _listed(page) == [str(older.pk), str(newer.pk)]
    html = page.content.decode()
    assert "amount=99 · to.iban=&quot;DE01&quot;" in html
    assert ">payment.send<" in html and ">orders<" in html and ">fleet-a<" in html
    assert "2 h ago" in html


def test_the_supervisor_role_decides_too(signed_in, supervisor, flow):
    approval = pending_approval(flow, "op-1")
    assert _listed(signed_in(supervisor).get("/approvals/")) == [str(approval.pk)]


def test_a_viewer_and_an_operator_see_an_empty_inbox(signed_in, viewer, operator, flow):
    pending_approval(flow, "op-1")
    for user in (viewer, operator):
        page = signed_in(user).get("/approvals/")
        assert _listed(page) == []
        assert "You may not decide approvals on any provider" in page.content.decode()


def test_an_outsider_sees_none_of_another_providers_approvals(
    signed_in, flow, host_api, approver_api, other_provider
):
    pending_approval(flow, "orders-1")
    ledger = pending_approval(Flow(host_api, approver_api, other_provider), "ledger-1")
    outsider = console_user("oscar", "decide_approvals", other_provider)
    assert _listed(signed_in(outsider).get("/approvals/")) == [str(ledger.pk)]
    assert _listed(signed_in(outsider).get("/approvals/?provider=orders")) == [str(ledger.pk)]


def test_a_group_restricted_approval_is_listed_only_for_its_groups(signed_in, provider, flow):
    restricted = pending_approval(flow, "op-treasury", groups=["treasury", "cfo"])
    open_to_all = pending_approval(flow, "op-any")
    member = console_user("tina", "decide_approvals", provider)
    member.groups.add(Group.objects.create(name="cfo"))
    other = console_user("otto", "decide_approvals", provider)
    other.groups.add(Group.objects.create(name="payments"))
    assert _listed(signed_in(member).get("/approvals/")) == [
        str(restricted.pk),
        str(open_to_all.pk),
    ]
    assert _listed(signed_in(other).get("/approvals/")) == [str(open_to_all.pk)]


def test_the_proposer_never_sees_their_own_action(signed_in, decider, flow):
    pending_approval(flow, "op-mine", proposer="dora")
    theirs = pending_approval(flow, "op-theirs", proposer="someone-else")
    assert _listed(signed_in(decider).get("/approvals/")) == [str(theirs.pk)]


def test_the_proposer_named_in_another_case_or_renamed_never_sees_it(
    signed_in, decider, supervisor, flow
):
    flow.register("op-1")
    opened = flow.host_api.post("/api/v1/operations/op-1/approvals", {"proposer": "Dora"})
    assert opened.status_code == 201, opened.content
    assert _listed(signed_in(decider).get("/approvals/")) == []
    decider.username = "dora2"
    decider.save(update_fields=["username"])
    assert _listed(signed_in(decider).get("/approvals/")) == []
    assert _listed(signed_in(supervisor).get("/approvals/")) == [opened.json()["approval_id"]]


def test_an_approval_they_voted_on_leaves_their_inbox_but_not_anothers(
    signed_in, decider, supervisor, flow
):
    approval = pending_approval(flow, "op-1", required=2)
    ApprovalVote.objects.create(
        approval=approval,
        voter=Actor.of("user", decider),
        voter_identity=Actor.of("user", decider).identity,
        approve=True,
        params_digest=approval.params_digest,
        at=timezone.now(),
    )
    assert _listed(signed_in(decider).get("/approvals/")) == []
    page = signed_in(supervisor).get("/approvals/")
    assert _listed(page) == [str(approval.pk)]
    assert '<span class="badge quorum">1 of 2</span>' in page.content.decode()


def test_an_approval_past_its_expiry_is_not_offered_before_the_sweep(signed_in, decider, flow):
    with time_machine.travel(timezone.now() - timedelta(seconds=5)):
        pending_approval(flow, "op-late", expires_at=timezone.now() + timedelta(seconds=1))
    in_time = pending_approval(flow, "op-1", expires_at=timezone.now() + timedelta(minutes=5))
    assert Approval.objects.get(operation_key="op-late").status == "pending"  # no sweep
    assert _listed(signed_in(decider).get("/approvals/")) == [str(in_time.pk)]


def test_decided_approvals_are_not_listed(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    Approval.objects.filter(pk=approval.pk).update(status=Approval.Status.DENIED)
    assert _listed(signed_in(decider).get("/approvals/")) == []
    assert (
        "Nothing waits for your decision." in signed_in(decider).get("/approvals/").content.decode()
    )


def test_expiry_is_shown_when_the_policy_set_one(signed_in, decider, flow):
    pending_approval(flow, "op-1", expires_at=timezone.now() + timedelta(minutes=30, seconds=5))
    html = signed_in(decider).get("/approvals/").content.decode()
    assert "in 30 min" in html


def test_filters_by_provider_action_and_host(
    signed_in, provider, other_provider, host_api, approver_api, other_host_api, flow
):
    both = console_user("bea", "decide_approvals", provider)
    from recovery.services.roles import role_grant

    role_grant(user=both, role="decide_approvals", provider=other_provider, actor=Actor.system("t"))
    orders = pending_approval(flow, "orders-1")
    ledger = pending_approval(Flow(host_api, approver_api, other_provider), "ledger-1")
    other_host = pending_approval(Flow(other_host_api, approver_api, provider), "orders-b")
    refund = pending_approval(flow, "orders-r")
    Approval.objects.filter(pk=refund.pk).update(action="refund.issue")
    client = signed_in(both)
    assert _listed(client.get("/approvals/?provider=ledger")) == [str(ledger.pk)]
    assert _listed(client.get("/approvals/?host=fleet-b")) == [str(other_host.pk)]
    assert _listed(client.get("/approvals/?action=refund")) == [str(refund.pk)]
    assert _listed(client.get("/approvals/?provider=orders&host=fleet-a&action=payment")) == [
        str(orders.pk)
    ]
    page = client.get("/approvals/?provider=nowhere")  # not a provider of theirs: ignored
    assert len(_listed(page)) == 4 and "Ignored: provider" in page.content.decode()
    assert "that matches these filters" in client.get("/approvals/?host=zz").content.decode()


def test_htmx_gets_the_list_alone_which_polls_with_its_filters(signed_in, decider, flow):
    approval = pending_approval(flow, "op-1")
    page = signed_in(decider).get("/approvals/?host=fleet", HTTP_HX_REQUEST="true")
    html = page.content.decode()
    assert html.lstrip().startswith('<div id="results" hx-get="/approvals/?host=fleet"')
    assert 'hx-trigger="every 5s"' in html and "<html" not in html
    assert _listed(page) == [str(approval.pk)]


def test_the_inbox_costs_the_same_few_statements_for_thirty_approvals(
    signed_in, decider, flow, django_assert_max_num_queries
):
    client = signed_in(decider)
    pending_approval(flow, "op-0", required=2)
    client.get("/approvals/")  # content types and the like are cached by the first request
    with django_assert_max_num_queries(6) as captured:
        assert len(_listed(client.get("/approvals/"))) == 1
    few = len(captured)  # a later request resets what the context saw
    for n in range(1, 30):
        pending_approval(flow, f"op-{n}", required=2, params={"n": n, "deep": {"list": [n]}})
    with django_assert_max_num_queries(few):
        assert len(_listed(client.get("/approvals/"))) == 30


def test_the_selector_starts_from_the_user(decider, viewer, flow):
    approval = pending_approval(flow, "op-1")
    rows, more = approvals_inbox(user=decider, filters=InboxFilters())
    assert [row.approval.pk for row in rows] == [approval.pk] and not more
    assert approvals_inbox(user=viewer, filters=InboxFilters()) == ([], False)


def test_the_summary_is_one_line_cut_short():
    assert params_summary('{"a":1,"b":{"c":[true,null]}}') == "a=1 · b.c.0=true · b.c.1=null"
    long = params_summary('{"memo":"' + "x" * 500 + '"}')
    assert len(long) == 90 and long.endswith("…")
    assert params_summary(None) == ""


# -- the navigation's link ---------------------------------------------------------------


def test_the_navigation_offers_approvals_to_deciders_only(signed_in, decider, operator):
    assert 'href="/approvals/"' in signed_in(decider).get("/").content.decode()
    assert 'href="/approvals/"' not in signed_in(operator).get("/").content.decode()


def test_a_superuser_gets_the_link_and_every_providers_approvals(signed_in, flow):
    approval = pending_approval(flow, "op-1")
    root = User.objects.create_superuser("root", "root@example.com", "unused-pw-0123")
    page = signed_in(root).get("/approvals/")
    assert _listed(page) == [str(approval.pk)] and 'href="/approvals/"' in page.content.decode()


def test_the_link_costs_the_queue_no_statement(
    signed_in, decider, operator, django_assert_max_num_queries
):
    """The navigation asks whether the user decides in the statement that asks whether
    they supervise."""
    for user in (decider, operator):
        client = signed_in(user)
        client.get("/")
        with django_assert_max_num_queries(5):
            assert client.get("/").status_code == 200


def test_anonymous_is_sent_to_sign_in(client):
    response = client.get("/approvals/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
