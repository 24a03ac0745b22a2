"""What the webhook tests share: an operation released through the host API, and the
bodies a receiver got."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.support.webhook_receiver import Receiver

if TYPE_CHECKING:
    from tests.support.flow import Flow


def released(flow: Flow, key: str = "op-1") -> None:
    flow.approved(key)
    token = flow.dispatch(key).json()["fencing_token"]
    response = flow.host_api.post(
        f"/api/v1/operations/{key}/result", {"fencing_token": token, "outcome": "committed"}
    )
    assert response.status_code == 200, response.content


def bodies(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(item.body) for item in receiver.received]
