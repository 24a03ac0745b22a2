"""Registering, opening the approval and dispatching in one request (``dispatch`` asked):
only where the policy approves the opening by itself; the one-dispatch rule intact."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Permit, PermitEvent
from approvals.selectors import permit_history
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of
from policies.services import policy_apply
from recovery.models import Dispatch, Operation
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db

POLICY = b"""
[[rules]]
name = "small"
provider = "orders"
when = ["/amount <= 2000"]
outcome = "approve"
reason = "small payments need nobody"

[rules.budget]
window = "24h"
count = 2
sum = "/amount"
limit = 3000

[[rules]]
name = "gbp"
when = ['/currency == "GBP"']
outcome = "deny"
"""


@pytest.fixture
def policy(db):
    policy_apply(source=POLICY, actor=Actor.system("test"))


def _register(host_api, key="op-1", params=None, dispatch=None, approval=None):
    params = params or PARAMS
    body: dict[str, Any] = {
        "key": key,
        "action": "payment.send",
        "provider": "orders",
        "params": params,
        "approval": {} if approval is None else approval,
        "dispatch": dispatch or {"worker": "w1", "params_digest": digest_of(params)},
    }
    if approval is False:
        del body["approval"]
    return host_api.post("/api/v1/operations", body)


def _kinds(key="op-1"):
    events = AuditEvent.objects.filter(operation_key=key).order_by("seq")
    return list(events.values_list("kind", flat=True))


def test_a_policy_approved_operation_is_dispatched_by_the_same_request(flow, policy, host_api):
    response = _register(host_api)
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["approval"]["status"] == "approved"
    # The operation as registered (docs/api.md), though it is dispatched when answered.
    assert (answer["state"], answer["version"]) == ("awaiting_approval", 1)
    held = answer["dispatch"]
    dispatch = Dispatch.objects.get()
    assert held["fencing_token"] == dispatch.fencing_token
    assert held["permit_id"] == str(dispatch.permit_id) == answer["approval"]["permit_id"]
    assert held["lease_expires_at"] == dispatch.lease_expires_at.isoformat()
    assert dispatch.worker == "w1"
    permit = Permit.objects.get()
    assert permit.status == Permit.Status.CONSUMED
    # Written once, already consumed: its issue is the moment of its consumption.
    assert permit.consumed_at == permit.issued_at == dispatch.created_at
    assert permit.consumed_by.kind == "host" and permit.expires_at > permit.consumed_at
    assert [line["kind"] for line in permit_history(permit)] == ["issued", "consumed"]
    assert Operation.objects.get().state == "dispatched"
    assert "permit_consumed" in _kinds() and "dispatch_refused" not in answer
    # The worker goes on with the fencing token it was handed.
    reported = host_api.post(
        "/api/v1/operations/op-1/result",
        {"fencing_token": held["fencing_token"], "outcome": "committed"},
    )
    assert reported.json()["state"] == "released"


def test_an_operation_a_person_must_approve_is_not_dispatched(flow, host_api):
    answer = _register(host_api).json()  # no policy: one person decides
    assert answer["approval"]["status"] == "pending"
    assert "dispatch" not in answer and "dispatch_refused" not in answer
    assert not Dispatch.objects.exists() and not Permit.objects.exists()
    assert Operation.objects.get().state == "awaiting_approval"


def test_an_operation_the_policy_denies_is_not_dispatched(flow, policy, host_api):
    answer = _register(host_api, params={**PARAMS, "currency": "GBP", "amount": 9000}).json()
    assert answer["approval"]["status"] == "denied"
    assert "dispatch" not in answer and "dispatch_refused" not in answer
    assert not Dispatch.objects.exists()
    assert Operation.objects.get().state == "denied"


def test_once_the_budget_is_spent_the_operation_waits_for_a_person(flow, policy, host_api):
    for n in (1, 2):
        assert "dispatch" in _register(host_api, key=f"op-{n}").json()
    answer = _register(host_api, key="op-3").json()  # the budget's count is 2
    assert answer["approval"]["status"] == "pending"
    assert "dispatch" not in answer
    assert Dispatch.objects.count() == 2
    assert Operation.objects.get(key="op-3").state == "awaiting_approval"


def test_the_same_request_again_hands_out_no_second_dispatch(flow, policy, host_api):
    first = _register(host_api).json()["dispatch"]
    again = _register(host_api)
    assert again.status_code == 200
    answer = again.json()
    assert answer["state"] == "dispatched"
    assert "dispatch" not in answer and "approval" not in answer
    assert first["fencing_token"] not in again.content.decode()
    assert Dispatch.objects.count() == 1
    # Nothing was attempted, so nothing was refused.
    assert not PermitEvent.objects.filter(kind=PermitEvent.Kind.REFUSED).exists()


def test_another_digest_is_refused_recorded_and_left_to_resume(flow, policy, host_api):
    wrong = {"worker": "w1", "params_digest": digest_of({**PARAMS, "amount": 1})}
    response = _register(host_api, dispatch=wrong)
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["approval"]["status"] == "approved"
    assert answer["dispatch_refused"] == "action_mismatch" and "dispatch" not in answer
    assert not Dispatch.objects.exists()
    assert PermitEvent.objects.filter(reason="action_mismatch").count() == 1
    assert "consume_refused" in _kinds()
    # The permit stands: resume, the usual way on, dispatches the exact action.
    resumed = flow.resume()
    assert resumed["decision"] == "dispatch" and resumed["fencing_token"]
    assert Dispatch.objects.count() == 1


def test_a_crash_before_the_dispatch_is_resumed_as_usual(flow, policy, host_api):
    # The opening committed; the request died before its dispatch (asked without it here).
    body = {"key": "op-1", "action": "payment.send", "provider": "orders", "params": PARAMS}
    opened = host_api.post("/api/v1/operations", {**body, "approval": {}}).json()
    assert opened["approval"]["status"] == "approved"
    again = _register(host_api).json()  # the host sends its request again
    assert again["state"] == "approved" and "dispatch" not in again
    resumed = flow.resume()
    assert resumed["decision"] == "dispatch" and resumed["fencing_token"]
    assert Dispatch.objects.count() == 1


def test_dispatch_asked_alone_opens_the_approval_it_needs(flow, policy, host_api):
    answer = _register(host_api, approval=False).json()
    assert answer["approval"]["status"] == "approved"
    assert answer["dispatch"]["fencing_token"] == Dispatch.objects.get().fencing_token


def test_a_bad_dispatch_body_is_refused_before_anything_is_registered(flow, policy, host_api):
    response = _register(host_api, dispatch={"worker": "w1"})
    assert response.status_code == 422, response.content
    assert response.json()["error"] == "missing_field"
    assert not Operation.objects.exists()
