"""Webhooks delivered by real Celery workers of the webhook queue to a real receiver; a
worker SIGKILLed while a delivery is in flight leaves it to be delivered again, with the
same webhook-id."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from common.actors import COMMAND_LINE
from tests.support.webhook_receiver import Receiver, receiver_serve
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def hooks_env(celery_env: dict[str, str | None], settings: Any, celery_queue: str) -> Any:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_queue
    settings.SETTLE_WEBHOOK_QUEUE = celery_env["SETTLE_WEBHOOK_QUEUE"]  # the commit's nudge
    return {
        **celery_env,
        "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_LEASE_SECONDS": "3",
        "SETTLE_WEBHOOK_TIMEOUT_SECONDS": "2",  # inside the lease: a send must end in it
        "SETTLE_WEBHOOK_SECONDS": "1",
    }


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.1)


def _released(flow: Any) -> None:
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    response = flow.host_api.post(
        "/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "committed"}
    )
    assert response.status_code == 200, response.content


def test_a_worker_delivers_signed_messages_in_order(
    flow: Any, host: Any, receiver: Receiver, hooks_env: Any, celery_procs: Any
) -> None:
    _, secret = webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    celery_procs("webhooks", hooks_env)
    started = time.monotonic()
    _released(flow)

    _wait(lambda: len(receiver.received) == 2, 20, "two deliveries")
    print(f"\ncommitted → received in {time.monotonic() - started:.2f} s (with no beat)")
    assert [json.loads(item.body)["type"] for item in receiver.received] == [
        "approval.decided",
        "operation.released",
    ]
    assert all(item.verified[secret] for item in receiver.received)
    _wait(
        lambda: WebhookMessage.objects.filter(status="delivered").count() == 2,
        10,
        "both recorded as delivered",
    )


def test_a_delivery_cut_by_a_sigkilled_worker_is_delivered_again_with_the_same_id(
    flow: Any, host: Any, receiver: Receiver, hooks_env: Any, celery_procs: Any
) -> None:
    _, secret = webhook_endpoint_add(host_name=host.name, url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    receiver.stalls = [30.0]  # the first request hangs while its worker is killed
    worker = celery_procs("webhooks", hooks_env)
    flow.approved()

    _wait(lambda: len(receiver.received) == 1, 20, "the first attempt reaching the receiver")
    worker.kill()  # SIGKILL, mid-delivery: no outcome was recorded
    message = WebhookMessage.objects.get()
    assert message.status == "pending" and message.attempts == 0
    assert message.lease_expires_at is not None

    celery_procs("webhooks", hooks_env)
    celery_procs("beat", hooks_env)
    _wait(lambda: len(receiver.received) == 2, 30, "the delivery again after the lease")
    first, second = receiver.received
    assert first.id == second.id == message.msg_id and first.body == second.body
    assert second.verified[secret]
    _wait(lambda: WebhookMessage.objects.get().status == "delivered", 10, "recorded as delivered")
