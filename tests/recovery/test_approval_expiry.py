"""Approvals nobody decided in time expire, and their operations with them, through the
transition table; the host hears of it as of a denial."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from approvals.models import Approval, ApprovalVote, Permit
from audit.models import AuditEvent
from common.actors import COMMAND_LINE, Actor
from harness.providers import digest_of
from policies.services import policy_apply
from recovery.models import Operation
from recovery.services.approval_expiry import approvals_expire, approvals_expire_due
from recovery.services.errors import RecoveryError
from recovery.services.permits import approval_decision
from tests.support.console import console_user
from tests.support.flow import PARAMS, Flow
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = pytest.mark.django_db


def opened(flow: Flow, key: str, *, expires_in: timedelta) -> dict[str, Any]:
    """An operation registered and its approval opened through the host API, due then."""
    flow.register(key)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals")
    assert response.status_code in (200, 201), response.content
    body = response.json()
    # The policy sets expires_at when the approval opens; here the test does.
    Approval.objects.filter(pk=body["approval_id"]).update(expires_at=timezone.now() + expires_in)
    return body


@pytest.fixture
def endpoint(settings: Any, host: Any) -> None:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    webhook_endpoint_add(host_name=host.name, url="http://127.0.0.1:9/hooks", actor=COMMAND_LINE)


def _decided(key: str) -> dict[str, Any]:
    [message] = WebhookMessage.objects.filter(operation__key=key, event="approval.decided")
    payload = json.loads(message.payload)
    return dict(payload["data"])


def test_a_due_approval_expires_with_its_operation_on_the_record(flow: Flow, endpoint: None):
    body = opened(flow, "op-1", expires_in=timedelta(minutes=-1))
    assert approvals_expire(now=timezone.now(), limit=10) == [
        Approval.objects.get(pk=body["approval_id"]).pk
    ]
    approval = Approval.objects.get(pk=body["approval_id"])
    assert approval.status == "expired" and approval.decided_at is not None
    assert approval.decided_by is not None and approval.decided_by.kind == "system"
    assert Operation.objects.get(key="op-1").state == "expired"
    [event] = AuditEvent.objects.filter(operation_key="op-1", kind="approval_expired")
    assert event.data["approval_id"] == body["approval_id"]
    transition = AuditEvent.objects.get(operation_key="op-1", kind="transition")
    assert (transition.data["event"], transition.data["to"]) == ("expire", "expired")
    assert _decided("op-1")["decision"] == "expired"
    # The host reads it as it reads any decision.
    assert flow.resume("op-1") == {"decision": "closed", "state": "expired", "recovered": False}
    detail = flow.approver_api.get(f"/api/v1/approvals/{body['approval_id']}").json()
    assert detail["status"] == "expired"
    assert approvals_expire(now=timezone.now(), limit=10) == []  # once


def test_the_host_hears_of_an_expiry_as_of_a_denial(flow: Flow, endpoint: None):
    opened(flow, "op-1", expires_in=timedelta(minutes=-1))
    approvals_expire(now=timezone.now(), limit=10)
    flow.register("op-2")
    approval = flow.host_api.post("/api/v1/operations/op-2/approvals").json()
    path = f"/api/v1/approvals/{approval['approval_id']}"
    reviewed = flow.approver_api.get(path).json()
    flow.approver_api.post(
        f"{path}/decision",
        {"decision": "deny", "ttl_seconds": 60, "params_digest": reviewed["params_digest"]},
    )
    expired, denied = _decided("op-1"), _decided("op-2")
    assert (expired.pop("decision"), denied.pop("decision")) == ("expired", "denied")
    assert (expired.pop("event"), denied.pop("event")) == ("expire", "deny")
    assert (expired.pop("state"), denied.pop("state")) == ("expired", "denied")
    assert (expired.pop("operation"), denied.pop("operation")) == ("op-1", "op-2")
    assert expired.pop("approval_id") and denied.pop("approval_id")
    assert expired == denied  # nothing else differs


def test_an_approval_not_due_or_without_expiry_stays_pending(flow: Flow):
    opened(flow, "op-1", expires_in=timedelta(minutes=5))
    flow.register("op-2")
    flow.host_api.post("/api/v1/operations/op-2/approvals")  # no expires_at: never
    assert approvals_expire(now=timezone.now(), limit=10) == []
    assert set(Approval.objects.values_list("status", flat=True)) == {"pending"}
    assert approvals_expire(now=timezone.now() + timedelta(minutes=6), limit=10) != []


def test_an_approval_decided_first_is_never_expired(flow: Flow):
    opened(flow, "op-1", expires_in=timedelta(minutes=1))
    flow.approve("op-1")  # in time; the sweep comes by once it would have been due
    assert approvals_expire(now=timezone.now() + timedelta(minutes=2), limit=10) == []
    assert Operation.objects.get(key="op-1").state == "approved"
    assert not AuditEvent.objects.filter(kind="approval_expired").exists()


def test_due_approvals_expire_in_batches(flow: Flow, settings: Any):
    settings.SETTLE_SWEEP_BATCH = 2
    for number in range(5):
        opened(flow, f"op-{number}", expires_in=timedelta(minutes=-1))
    assert len(approvals_expire(now=timezone.now(), limit=2)) == 2
    assert approvals_expire_due(now=timezone.now()) == 3
    assert set(Operation.objects.values_list("state", flat=True)) == {"expired"}


def test_a_permits_expiry_is_not_an_approval_decision(flow: Flow, endpoint: None):
    """Only the approval's own expiry is ``approval.decided``; a permit's is not."""
    flow.approved("op-1")
    Approval.objects.filter(operation_key="op-1").update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    assert approvals_expire(now=timezone.now(), limit=10) == []  # decided already
    [decided] = WebhookMessage.objects.filter(event="approval.decided")
    assert json.loads(decided.payload)["data"]["decision"] == "approved"


# -- a decision after expires_at, before any sweep ---------------------------------------

EXPIRES_SOON = b"""
[[rules]]
name = "soon"
outcome = "quorum"
approvals = 2
expires_after = "1s"
"""


def opened_past_due(flow: Flow, key: str, *, policy: bytes | None = None) -> dict[str, Any]:
    """An approval opened a few seconds ago with a one-second expiry; no sweep ran since.

    Opened in the past (time-machine) so that its ``expires_at`` is behind the database's
    own clock too, which time-machine does not move on PostgreSQL.
    """
    if policy is not None:
        policy_apply(source=policy, actor=Actor.system("test"))
    with time_machine.travel(timezone.now() - timedelta(seconds=5)):
        flow.register(key)
        response = flow.host_api.post(f"/api/v1/operations/{key}/approvals")
        assert response.status_code == 201, response.content
        body: dict[str, Any] = response.json()
        if policy is None:
            Approval.objects.filter(pk=body["approval_id"]).update(
                expires_at=timezone.now() + timedelta(seconds=1)
            )
    return body


def _refused_and_expired(key: str, approval_id: str) -> None:
    """The refusal is on the record and the approval closed with its operation, at once."""
    refused = AuditEvent.objects.get(operation_key=key, kind="decision_refused")
    assert refused.data == {"approval_id": approval_id, "code": "approval_expired"}
    assert Approval.objects.get(pk=approval_id).status == "expired"
    assert Operation.objects.get(key=key).state == "expired"
    assert AuditEvent.objects.filter(operation_key=key, kind="approval_expired").count() == 1
    assert not Permit.objects.filter(operation_key=key).exists()


def test_an_expired_approval_cannot_be_decided_by_an_approver(flow: Flow):
    body = opened_past_due(flow, "op-1")
    path = f"/api/v1/approvals/{body['approval_id']}"
    response = flow.approver_api.post(
        f"{path}/decision",
        {"decision": "approve", "ttl_seconds": 604800, "params_digest": digest_of(PARAMS)},
    )
    assert (response.status_code, response.json()["error"]) == (409, "approval_expired")
    _refused_and_expired("op-1", body["approval_id"])
    assert flow.dispatch("op-1").status_code == 409
    assert approvals_expire(now=timezone.now(), limit=10) == []  # nothing left to sweep


def test_an_expired_quorum_takes_no_more_votes(flow: Flow, provider: Any):
    body = opened_past_due(flow, "op-1", policy=EXPIRES_SOON)
    ann = console_user("ann", "decide_approvals", provider)
    with pytest.raises(RecoveryError) as refused:
        approval_decision(
            approval_id=body["approval_id"],
            approve=True,
            ttl_seconds=300,
            decided_by=Actor.of("user", ann),
            reviewed_digest=digest_of(PARAMS),
        )
    assert refused.value.code == "approval_expired"
    assert not ApprovalVote.objects.exists()
    _refused_and_expired("op-1", body["approval_id"])


def test_the_last_vote_of_a_quorum_after_expiry_decides_nothing(flow: Flow, provider: Any):
    # The quorum's rule with an hour to decide: the first vote is in time however slow the
    # machine; then the approval's time is made to run out.
    policy_apply(source=EXPIRES_SOON.replace(b'"1s"', b'"1h"'), actor=Actor.system("test"))
    ann = console_user("ann", "decide_approvals", provider)
    flow.register("op-1")
    body = flow.host_api.post("/api/v1/operations/op-1/approvals").json()
    approval, _ = approval_decision(
        approval_id=body["approval_id"],
        approve=True,
        ttl_seconds=300,
        decided_by=Actor.of("user", ann),
        reviewed_digest=digest_of(PARAMS),
    )
    assert approval.status == "pending"  # in time: 1 of 2
    # Its time runs out (a minute behind the database's clock too); no sweep runs.
    Approval.objects.filter(pk=body["approval_id"]).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    response = flow.approver_api.post(
        f"/api/v1/approvals/{body['approval_id']}/decision",
        {"decision": "approve", "params_digest": digest_of(PARAMS)},
    )
    assert (response.status_code, response.json()["error"]) == (409, "approval_expired")
    assert ApprovalVote.objects.count() == 1
    _refused_and_expired("op-1", body["approval_id"])
