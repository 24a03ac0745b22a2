"""A host names its customer when it opens an approval: the party, its link, its expiry."""

from __future__ import annotations

import pytest

from approvals.models import Approval, Party
from audit.models import AuditEvent
from common.links import approval_link_url
from recovery.models import Operation
from tests.support.customers import PARTY, customer_open, customer_policy_apply
from tests.support.flow import PARAMS, register_body


@pytest.fixture
def policy(db):
    customer_policy_apply()


def test_the_answer_carries_the_party_the_link_and_its_expiry(flow, policy):
    opened = customer_open(flow, party={**PARTY, "contact": ""})
    approval = Approval.objects.get(pk=opened["approval_id"])
    assert opened["party"] == {"id": "cust_8812", "name": "Ada Lovelace", "contact": ""}
    assert opened["link"] == approval_link_url(approval.id)
    assert opened["expires_at"] == approval.expires_at.isoformat()
    assert opened["status"] == "pending" and opened["needed"] == "the customer's decision"
    assert approval.customer == "customer" and approval.party.party == "cust_8812"
    requested = AuditEvent.objects.get(kind="approval_requested")
    assert requested.data["party"] == "fleet-a/cust_8812"
    assert requested.data["customer"] == "customer"


def test_the_host_reads_its_approval_with_the_link_staff_without(flow, policy, operator):
    opened = customer_open(flow)
    path = f"/api/v1/approvals/{opened['approval_id']}"
    record = flow.host_api.get(path).json()
    assert record["link"] == opened["link"] and record["party"]["id"] == "cust_8812"
    assert record["expires_at"] == opened["expires_at"]
    staff = flow.approver_api.get(path).json()
    assert "link" not in staff


def test_another_host_does_not_see_the_approval(flow, policy, other_host_api):
    opened = customer_open(flow)
    response = other_host_api.get(f"/api/v1/approvals/{opened['approval_id']}")
    assert response.status_code == 404 and response.json()["error"] == "unknown_approval"


def test_one_party_row_per_host_and_id_taking_the_latest_name(flow, policy):
    customer_open(flow, "op-1")
    customer_open(flow, "op-2", party={"id": "cust_8812", "name": "Ada King"})
    party = Party.objects.get()
    assert party.display_name == "Ada King"
    assert Approval.objects.filter(party=party).count() == 2


def test_registering_and_opening_in_one_request_names_the_party(flow, policy):
    body = {
        "key": "op-1",
        "action": "payment.send",
        "provider": "orders",
        "params": PARAMS,
        "approval": {"party": PARTY},
    }
    answer = flow.host_api.post("/api/v1/operations", body).json()
    assert answer["approval"]["party"]["id"] == "cust_8812" and answer["approval"]["link"]


def test_an_approval_needing_the_customer_without_a_party_is_refused_and_nothing_written(
    flow, policy
):
    flow.register("op-1")
    response = flow.host_api.post("/api/v1/operations/op-1/approvals")
    assert response.status_code == 422 and response.json()["error"] == "party_required"
    assert not Approval.objects.exists() and not Party.objects.exists()
    assert not AuditEvent.objects.filter(kind="approval_requested").exists()
    assert Operation.objects.get(key="op-1").state == "awaiting_approval"


def test_registering_and_opening_in_one_request_refused_registers_nothing(flow, policy):
    """A new operation's approval opens in the registration's transaction: when the
    opening is refused, the registration is not kept, and the same request with the
    party registers and opens (201), as if the first had not been sent."""
    body = register_body(approval={})
    response = flow.host_api.post("/api/v1/operations", body)
    assert response.status_code == 422 and response.json()["error"] == "party_required"
    assert not Operation.objects.exists() and not Approval.objects.exists()
    assert not AuditEvent.objects.filter(operation_key="op-1").exists()
    again = flow.host_api.post("/api/v1/operations", {**body, "approval": {"party": PARTY}})
    assert again.status_code == 201, again.content
    assert again.json()["approval"]["party"]["id"] == "cust_8812"
    assert [e.kind for e in AuditEvent.objects.filter(operation_key="op-1").order_by("seq")] == [
        "registered",
        "approval_requested",
    ]


@pytest.mark.parametrize(
    ("party", "code"),
    [
        ({"id": ""}, "invalid_field"),
        ({"id": "has space"}, "invalid_field"),
        ({"id": "x" * 101}, "invalid_field"),
        ({"id": "ok", "name": "n" * 201}, "invalid_field"),
        ({"id": "ok", "contact": "c" * 501}, "invalid_field"),
        ({"id": "ok", "name": "a\x00b"}, "invalid_field"),
        ({"id": 5}, "invalid_field"),
        ({"name": "no id"}, "missing_field"),
        ({"id": "ok", "phone": "+44"}, "unknown_field"),
        ("cust_8812", "invalid_field"),
    ],
)
def test_a_bad_party_is_refused_with_a_stable_code(flow, policy, party, code):
    flow.register("op-1")
    response = flow.host_api.post("/api/v1/operations/op-1/approvals", {"party": party})
    assert response.status_code in (400, 422) and response.json()["error"] == code
    assert not Approval.objects.exists() and not Party.objects.exists()


def test_a_contact_outside_the_operators_lists_is_refused(flow, policy, settings):
    settings.SETTLE_PARTY_NOTIFY_SCHEMES = ("mailtos",)
    settings.SETTLE_PARTY_NOTIFY_HOSTS = ("smtp.example.com",)
    flow.register("op-1")
    for contact in [
        "json://attacker.example.net/hook",
        "mailtos://user:pw@smtp.example.org",
        "jsons://smtp.example.com/x",
        "not a url",
    ]:
        body = {"party": {**PARTY, "contact": contact}}
        response = flow.host_api.post("/api/v1/operations/op-1/approvals", body)
        assert response.status_code == 422, contact
        assert response.json()["error"] == "contact_not_allowed"
    assert not Approval.objects.exists() and not Party.objects.exists()
    allowed = {"party": {**PARTY, "contact": "mailtos://user:pw@smtp.example.com"}}
    response = flow.host_api.post("/api/v1/operations/op-1/approvals", allowed)
    assert response.status_code == 201, response.content


def test_without_the_operators_lists_settle_sends_to_no_party(flow, policy):
    flow.register("op-1")
    body = {"party": {**PARTY, "contact": "mailtos://user:pw@smtp.example.com"}}
    response = flow.host_api.post("/api/v1/operations/op-1/approvals", body)
    assert response.json()["error"] == "contact_not_allowed"
