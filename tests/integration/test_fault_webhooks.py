"""Hostile receivers beside a good one: one that sends ``HTTP/1.1 200 OK`` and then a
header byte every second forever, and one that accepts and never answers, both of one
host; another host's good receiver still gets each of its events once, within seconds,
and the hostile endpoints' messages count their attempts and wait for their next try.

Everything is real: the receivers' sockets, ``celery -A settle worker -Q`` the webhook
queue and beat on Redis, PostgreSQL, the host API's commits nudging deliveries.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone

from common.actors import COMMAND_LINE
from tests.support.flow import Api, Flow
from tests.support.webhook_receiver import (
    Receiver,
    Silent,
    receiver_serve,
    silent_serve,
    trickling_serve,
)
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

OPERATIONS = 12  # released per host: an approval.decided and an operation.released each
TIMEOUT = 2  # SETTLE_WEBHOOK_TIMEOUT_SECONDS: above the trickle's 1 s between bytes
LEASE = 5  # SETTLE_WEBHOOK_LEASE_SECONDS: a duplicate would come within it
# From the good host's last commit to its receiver holding every event: a hostile
# endpoint costs a round at most one deadline.
GOOD_BOUND = 10.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve(Receiver())


@pytest.fixture
def silent() -> Iterator[Silent]:
    yield from silent_serve()


@pytest.fixture
def trickling() -> Iterator[str]:
    with trickling_serve(every=1.0, head=True) as url:
        yield url


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.1)


def _released(flow: Flow, key: str) -> None:
    flow.approved(key)
    token = flow.dispatch(key).json()["fencing_token"]
    response = flow.host_api.post(
        f"/api/v1/operations/{key}/result", {"fencing_token": token, "outcome": "committed"}
    )
    assert response.status_code == 200, response.content


def test_trickling_and_silent_receivers_neither_delay_nor_duplicate_another_hosts_events(
    flow: Flow,
    other_host_api: Api,
    approver_api: Api,
    provider: Any,
    receiver: Receiver,
    silent: Silent,
    trickling: str,
    celery_env: dict[str, str | None],
    celery_queue: str,
    celery_procs: Any,
    settings: Any,
) -> None:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_queue
    settings.SETTLE_WEBHOOK_QUEUE = celery_env["SETTLE_WEBHOOK_QUEUE"]  # the commits' nudges
    env = {
        **celery_env,
        "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT),
        "SETTLE_WEBHOOK_LEASE_SECONDS": str(LEASE),
        "SETTLE_WEBHOOK_SECONDS": "1",
    }
    good, secret = webhook_endpoint_add(host_name="fleet-a", url=receiver.url, actor=COMMAND_LINE)
    receiver.secrets.append(secret)
    hostile = Flow(other_host_api, approver_api, provider)
    trickler, _ = webhook_endpoint_add(host_name="fleet-b", url=trickling, actor=COMMAND_LINE)
    hanging, _ = webhook_endpoint_add(host_name="fleet-b", url=silent.url, actor=COMMAND_LINE)
    webhooks = celery_procs("webhooks", env)
    celery_procs("beat", env)

    # The hostile host's events first: the webhook worker is busy with its receivers.
    for n in range(OPERATIONS):
        _released(hostile, f"hostile-{n:02d}")
    _wait(lambda: silent.accepted > 0, 20, "a delivery reaching the silent receiver")
    for n in range(OPERATIONS):
        _released(flow, f"good-{n:02d}")
    committed = time.monotonic()
    expected = WebhookMessage.objects.filter(endpoint=good).count()
    assert expected == 2 * OPERATIONS

    _wait(
        lambda: len({item.id for item in receiver.received}) == expected,
        GOOD_BOUND,
        f"{expected} events at the good receiver",
    )
    took = time.monotonic() - committed
    # Past a lease and a few beat rounds: a claim whose outcome was lost would be sent again.
    time.sleep(LEASE + 2)
    ids = Counter(item.id for item in receiver.received)
    types = Counter(json.loads(item.body)["type"] for item in receiver.received)
    print(
        f"\nbeside a trickling and a silent receiver: {expected} events at the good one "
        f"{took:.2f} s after its host's last commit; {sum(ids.values())} requests"
    )
    assert max(ids.values()) == 1, [msg_id for msg_id, count in ids.items() if count > 1]
    assert types == {"approval.decided": OPERATIONS, "operation.released": OPERATIONS}
    assert all(item.verified[secret] for item in receiver.received)
    assert not WebhookMessage.objects.filter(endpoint=good).exclude(status="delivered")

    # The hostile endpoints' messages were tried, counted, and wait for their next try.
    now = timezone.now()
    for endpoint in (trickler, hanging):
        tried = list(WebhookMessage.objects.filter(endpoint=endpoint, attempts__gt=0))
        assert tried, f"no attempt counted for {endpoint.url}"
        # A later task may have deferred one again since (its last error says so).
        assert any("Timeout" in message.last_error for message in tried), tried
        for message in tried:
            assert message.status == "pending", message
            assert message.lease_expires_at is None or message.lease_expires_at > now
            assert message.next_attempt_at is not None
            assert message.last_attempt_at is not None
            assert message.next_attempt_at > message.last_attempt_at
    assert "SoftTimeLimitExceeded" not in webhooks.log()
    assert "TimeLimitExceeded" not in webhooks.log()
