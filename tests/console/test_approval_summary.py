"""The action in plain words on the approval page and in the inbox, escaped, from the policy
each approval opened under."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from common.actors import Actor
from policies import services
from policies.services import policy_apply
from tests.support.console import console_user, pending_approval

pytestmark = pytest.mark.django_db

PAY = {"amount": "1250.50", "currency": "EUR", "to": "acct-7"}
POLICY = b"""
[[actions]]
provider = "orders"
action = "payment.send"
summary = "Pay {/amount:money:/currency} to {/to}"
"""


@pytest.fixture
def decider(provider) -> User:
    return console_user("dora", "decide_approvals", provider)


def _apply(source: bytes) -> None:
    policy_apply(source=source, actor=Actor.system("test"))


def _page(client, approval) -> str:
    response = client.get(f"/approvals/{approval.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_page_leads_with_the_summary_above_the_parameters_and_digest(signed_in, decider, flow):
    _apply(POLICY)
    approval = pending_approval(flow, "pay-1", params=PAY)
    html = _page(signed_in(decider), approval)
    summary = '<p class="plain-words" data-summary>Pay €1,250.50 to acct-7</p>'
    assert summary in html
    assert html.index(summary) < html.index("data-digest") < html.index("<h3>Parameters</h3>")


def test_without_a_summary_the_page_says_why_and_lists_the_parameters(signed_in, decider, flow):
    approval = pending_approval(flow, "pay-1", params={"amount": 5})
    html = _page(signed_in(decider), approval)
    assert "Summary unavailable: the policy has no summary for orders payment.send." in html
    assert "<code>amount</code>" in html  # the parameters' table, as without a policy
    _apply(POLICY)
    later = pending_approval(flow, "pay-2", params={"amount": 5, "currency": "EUR"})
    assert "Summary unavailable: /to missing." in _page(signed_in(decider), later)


def test_a_policy_applied_later_does_not_change_an_approvals_summary(signed_in, decider, flow):
    _apply(POLICY)
    approval = pending_approval(flow, "pay-1", params=PAY)
    _apply(POLICY.replace(b"Pay {", b"Send {"))
    client = signed_in(decider)
    assert "Pay €1,250.50 to acct-7" in _page(client, approval)
    assert "Send €1,250.50 to acct-7" in _page(client, pending_approval(flow, "pay-2", params=PAY))


def test_the_summary_and_its_values_are_escaped(signed_in, decider, flow):
    _apply(POLICY.replace(b'"Pay {', b'"<script>alert(0)</script> Pay {'))
    params = {**PAY, "to": "<script>alert(1)</script>"}
    approval = pending_approval(flow, "pay-1", params=params)
    client = signed_in(decider)
    for html in (_page(client, approval), client.get("/approvals/").content.decode()):
        assert "<script>alert" not in html
        assert "&lt;script&gt;alert(0)&lt;/script&gt; Pay €1,250.50" in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_inbox_shows_the_summary_or_else_the_parameters(signed_in, decider, flow):
    pending_approval(flow, "op-bare", params={"amount": 99})
    _apply(POLICY)
    pending_approval(flow, "op-pay", params=PAY)
    html = signed_in(decider).get("/approvals/").content.decode()
    assert '<span class="sentence" data-summary>Pay €1,250.50 to acct-7</span>' in html
    assert "<code>amount=99</code>" in html


def test_the_inbox_reads_the_policies_once_whatever_the_approvals(
    signed_in, decider, flow, django_assert_max_num_queries
):
    client = signed_in(decider)
    _apply(POLICY)
    pending_approval(flow, "op-0", params=PAY)
    client.get("/approvals/")  # content types and the like are cached by the first request
    with django_assert_max_num_queries(6) as captured:
        client.get("/approvals/")
    few = len(captured)
    _apply(POLICY.replace(b"Pay {", b"Send {"))
    for n in range(1, 30):
        pending_approval(flow, f"op-{n}", params=PAY)
    # Two versions, both kept by this process since it opened approvals under them.
    with django_assert_max_num_queries(few):
        html = client.get("/approvals/").content.decode()
    assert html.count("data-summary>Pay ") == 1 and html.count("data-summary>Send ") == 29
    # A process that has read neither (another web process) reads both in one statement.
    services._cached.clear()
    with django_assert_max_num_queries(few + 1):
        client.get("/approvals/")
