"""Registering an operation and opening its approval in one request (``approval`` asked)."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from audit.models import AuditEvent
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


def _register(host_api, approval=None, key="op-1"):
    body = {"key": key, "action": "payment.send", "provider": "orders", "params": PARAMS}
    if approval is not None:
        body["approval"] = approval
    return host_api.post("/api/v1/operations", body)


def test_the_approval_opens_with_the_registration(host_api, provider):
    response = _register(host_api, {"proposer": ""})
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["state"] == "awaiting_approval"
    opened = answer["approval"]
    assert opened["status"] == "pending" and opened["permit_id"] is None
    assert str(Approval.objects.get().id) == opened["approval_id"]
    kinds = list(AuditEvent.objects.filter(operation_key="op-1").values_list("kind", flat=True))
    assert kinds == ["registered", "approval_requested"]


def test_the_same_request_again_answers_the_pending_approval(host_api, provider):
    first = _register(host_api, {}).json()["approval"]
    again = _register(host_api, {})
    assert again.status_code == 200
    assert again.json()["approval"]["approval_id"] == first["approval_id"]
    assert Approval.objects.count() == 1


def test_without_approval_the_answer_is_the_registration_alone(host_api, provider):
    answer = _register(host_api).json()
    assert "approval" not in answer
    assert not Approval.objects.exists()


def test_an_operation_past_approval_is_registered_again_without_one(flow, host_api):
    flow.approved()
    response = _register(host_api, {})
    assert response.status_code == 200
    assert response.json()["state"] == "approved"
    assert "approval" not in response.json()
    assert Approval.objects.count() == 1


def test_the_opened_approval_goes_on_as_any_other(flow, host_api, approver_api):
    opened = _register(host_api, {}).json()["approval"]
    reviewed = approver_api.get(f"/api/v1/approvals/{opened['approval_id']}").json()
    decided = approver_api.post(
        f"/api/v1/approvals/{opened['approval_id']}/decision",
        {"decision": "approve", "params_digest": reviewed["params_digest"]},
    )
    assert decided.status_code == 200, decided.content
    assert flow.dispatch().status_code == 200


def test_a_bad_approval_body_is_refused_before_anything_is_registered(host_api, provider):
    response = _register(host_api, {"proposer": "x", "extra": 1})
    assert response.status_code == 400, response.content  # unknown_field
    assert not AuditEvent.objects.filter(operation_key="op-1").exists()
