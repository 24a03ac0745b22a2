"""Replays and stale requests record only the refusal (or the stale signal), nothing else."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Approval, PermitEvent
from harness.providers import digest_of
from recovery.models import Dispatch, Operation
from tests.support.bad_input import (
    ENDPOINTS,
    assert_error,
    assert_only_recorded,
    assert_unchanged,
    snapshot,
)
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


# -- replays and stale requests -------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_deciding_an_already_decided_approval_is_409_already_decided(world, decision):
    before = snapshot()
    response = world.send(
        ENDPOINTS["decision"],
        body={"decision": decision, "params_digest": digest_of(PARAMS)},
        approval_id=world.decided_approval_id,
    )
    assert_error(response, 409, "already_decided", status="approved")
    assert_unchanged(before)


def test_a_denied_approval_cannot_be_approved_afterwards(world):
    endpoint = ENDPOINTS["decision"]
    denied = world.send(endpoint, body={"decision": "deny", "params_digest": digest_of(PARAMS)})
    assert denied.status_code == 200, denied.content
    before = snapshot()
    response = world.send(
        endpoint, body={"decision": "approve", "params_digest": digest_of(PARAMS)}
    )
    assert_error(response, 409, "already_decided", status="denied")
    assert_unchanged(before)


def test_dispatch_after_consumption_records_only_the_refusal(world):
    before = snapshot()
    response = world.send(ENDPOINTS["dispatch"])
    assert_error(response, 409, "already_consumed", execution_state="dispatched")
    events = assert_only_recorded(before, PermitEvent=1, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "already_consumed")]
    refusal = PermitEvent.objects.order_by("-id").first()
    assert (refusal.kind, refusal.reason) == ("refused", "already_consumed")


def test_dispatch_without_a_permit_records_only_the_refusal(world):
    before = snapshot()
    response = world.send(ENDPOINTS["dispatch"], key="op-2")
    assert_error(response, 409, "not_authorized")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "not_authorized")]


def test_dispatch_with_another_digest_records_only_the_refusal(world, flow):
    flow.approved("op-3")
    before = snapshot()
    body = {"worker": "w9", "params_digest": digest_of({**PARAMS, "amount": 1})}
    response = world.send(ENDPOINTS["dispatch"], body=body, key="op-3")
    assert_error(response, 409, "action_mismatch")
    events = assert_only_recorded(before, PermitEvent=1, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "action_mismatch")]


@pytest.mark.parametrize("name", ["heartbeat", "result"])
@pytest.mark.parametrize(
    ("key", "token"),
    [
        pytest.param("op-1", "forged", id="forged"),
        pytest.param("op-1", "A" * 32, id="well-formed-but-wrong"),
        pytest.param("op-2", None, id="anothers-token-on-an-undispatched-operation"),
    ],
)
def test_a_wrong_fencing_token_records_only_a_stale_signal(world, name, key, token):
    endpoint = ENDPOINTS[name]
    body = {**endpoint.body(world), "fencing_token": token or world.fencing_token}
    before = snapshot()
    response = world.send(endpoint, body=body, key=key)
    assert_error(response, 409, "stale_fencing_token")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [("stale_signal", "stale_fencing_token")]


def test_a_heartbeat_after_the_lease_was_lost_is_409_lease_lost(world, flow):
    Dispatch.objects.update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    assert flow.resume("op-1")["state"] == "unknown"
    before = snapshot()
    response = world.send(ENDPOINTS["heartbeat"])
    assert_error(response, 409, "lease_lost", state="unknown")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [
        ("stale_signal", "heartbeat_after_lease")
    ]


@pytest.mark.parametrize(("key", "state"), [("op-1", "dispatched"), ("op-3", "denied")])
def test_opening_an_approval_on_an_operation_not_awaiting_one_is_409(world, flow, key, state):
    if key == "op-3":
        flow.register("op-3")
        approval = world.host.post("/api/v1/operations/op-3/approvals").json()
        denied = world.approver.post(
            f"/api/v1/approvals/{approval['approval_id']}/decision",
            {"decision": "deny", "params_digest": digest_of(PARAMS)},
        )
        assert denied.status_code == 200
    before = snapshot()
    response = world.send(ENDPOINTS["approvals"], key=key)
    assert_error(response, 409, "invalid_state", state=state)
    assert_unchanged(before)


def test_a_decision_on_an_operation_that_moved_on_changes_nothing_but_is_recorded(world):
    """The approval is still pending but its operation is no longer awaiting approval."""
    Operation.objects.filter(key="op-2").update(state="expired")
    before = snapshot()
    response = world.send(ENDPOINTS["decision"])
    assert_error(response, 409, "stale_state", state="expired")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [("stale_signal", "transition_refused")]
    assert Approval.objects.get(pk=world.approval_id).status == "pending"


@pytest.mark.parametrize("caller", ["host", "other_host"])
def test_the_same_key_with_a_different_action_is_409_key_conflict(world, caller):
    body = {"key": "op-1", "action": "payment.send", "provider": "orders", "params": {"x": 1}}
    before = snapshot()
    assert_error(world.send(ENDPOINTS["register"], body=body, caller=caller), 409, "key_conflict")
    assert_unchanged(before)
