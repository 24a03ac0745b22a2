"""A customer's approval reaches the host: ``approval.opened`` with the link, and
``approval.decided`` saying the party decided, how and when."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from common.links import approval_link_url
from tests.support.customers import Page, customer_open, customer_policy_apply
from tests.support.webhooks import bodies
from webhooks.delivery import webhooks_deliver
from webhooks.models import WebhookMessage

pytestmark = pytest.mark.django_db


@pytest.fixture
def policy(db):
    customer_policy_apply()


def test_approval_opened_carries_the_party_and_the_link_which_no_table_keeps(
    flow, policy, endpoint, receiver
):
    opened = customer_open(flow)
    stored = WebhookMessage.objects.get(event="approval.opened")
    assert opened["link"].split("#")[1] not in stored.payload
    assert webhooks_deliver(seconds=5).delivered == 1
    (body,) = bodies(receiver)
    assert body["type"] == "approval.opened" and all(receiver.received[0].verified.values())
    data = body["data"]
    assert data["approval_id"] == opened["approval_id"] and data["operation"] == "op-1"
    assert data["party"] == {"id": "cust_8812", "name": "Ada Lovelace"}
    assert data["link"] == approval_link_url(opened["approval_id"]) == opened["link"]
    assert data["expires_at"] == opened["expires_at"]


def test_approval_decided_says_the_party_decided_by_link_and_when(flow, policy, endpoint, receiver):
    opened = customer_open(flow)
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    Page(opened["approval_id"]).decide("deny", digest, reason="not me")
    assert webhooks_deliver(seconds=5).delivered == 2
    decided = bodies(receiver)[1]
    assert decided["type"] == "approval.decided"
    data = decided["data"]
    assert data["decision"] == "denied" and data["reason"] == "not me"
    assert data["party"] == {"id": "cust_8812", "name": "Ada Lovelace"}
    assert data["party_decision"] == "deny" and data["method"] == "link"
    vote = Approval.objects.get(pk=opened["approval_id"]).votes.get()
    assert data["decided_at"] == vote.at.isoformat()


def test_an_approval_not_addressed_to_the_customer_opens_without_an_event(flow, endpoint, receiver):
    flow.register("op-1")
    flow.host_api.post("/api/v1/operations/op-1/approvals")
    assert not WebhookMessage.objects.exists()
