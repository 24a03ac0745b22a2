"""The world every bad-input test starts from (``tests.support.bad_input.World``)."""

from __future__ import annotations

import pytest

from recovery.services.providers import provider_configure
from tests.support.bad_input import SECRET, World
from tests.support.flow import PARAMS


@pytest.fixture
def world(flow, host_api, other_host_api, approver_api) -> World:
    decided = flow.approved("op-1")
    decided_approval_id = decided["approval_id"]
    dispatched = flow.dispatch("op-1")
    assert dispatched.status_code == 200, dispatched.content
    flow.register("op-2")
    opened = host_api.post("/api/v1/operations/op-2/approvals")
    assert opened.status_code == 201, opened.content
    provider_configure(name="hp", adapter="http", url="http://127.0.0.1:9", secret=SECRET)
    registered = host_api.post(
        "/api/v1/operations",
        {"key": "op-h", "action": "payment.send", "provider": "hp", "params": PARAMS},
    )
    assert registered.status_code == 201, registered.content
    return World(
        host=host_api,
        other_host=other_host_api,
        approver=approver_api,
        approval_id=opened.json()["approval_id"],
        decided_approval_id=decided_approval_id,
        permit_id=decided["permit_id"],
        fencing_token=dispatched.json()["fencing_token"],
    )
