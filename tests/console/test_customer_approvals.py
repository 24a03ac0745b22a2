"""Staff see the customer an approval is addressed to, and that their decision is awaited."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import Approval
from tests.support.customers import Page, customer_open, customer_policy_apply
from tests.support.flow import PARAMS


@pytest.fixture
def policy(db):
    customer_policy_apply()


def _page(user: User, approval_id: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/approvals/{approval_id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_staff_see_the_party_and_that_the_customer_decides_alone(flow, policy, supervisor):
    opened = customer_open(flow)
    html = _page(supervisor, opened["approval_id"])
    assert "Ada Lovelace" in html and "cust_8812 of fleet-a" in html
    assert "awaiting the customer's decision" in html
    assert "staff cannot decide it" in html
    assert 'name="decision" value="approve"' not in html


def test_customer_and_staff_offers_staff_their_decision(flow, policy, supervisor):
    opened = customer_open(flow, params={**PARAMS, "currency": "GBP"})
    html = _page(supervisor, opened["approval_id"])
    assert "the customer's approval and one staff person's" in html
    assert 'name="decision" value="approve"' in html
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    Page(opened["approval_id"]).decide("approve", digest)
    after = _page(supervisor, opened["approval_id"])
    assert "the customer decided" in after and "fleet-a/cust_8812" in after


def test_a_viewer_of_another_provider_sees_nothing_of_it(flow, policy, db):
    opened = customer_open(flow)
    outsider = User.objects.create_user("outsider")
    client = Client()
    client.force_login(outsider)
    response = client.get(f"/approvals/{opened['approval_id']}/")
    assert response.status_code == 404
    assert "Ada Lovelace" not in response.content.decode()


def test_the_inbox_offers_staff_only_what_they_may_decide(flow, policy, supervisor):
    """The customer's alone is left out of staff's inbox (its page still shows it);
    the customer's and staff's is in it."""
    alone = customer_open(flow)
    both = customer_open(flow, key="op-2", params={**PARAMS, "currency": "GBP"})
    client = Client()
    client.force_login(supervisor)
    inbox = client.get("/approvals/").content.decode()
    assert f"/approvals/{both['approval_id']}/" in inbox
    assert f"/approvals/{alone['approval_id']}/" not in inbox
