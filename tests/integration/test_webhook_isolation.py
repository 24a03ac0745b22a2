"""A receiver that accepts and never answers holds only the webhook queue's worker: the
default queue's worker still sweeps and settles a stranded operation in seconds, and the
host API answers, while a flood of webhook deliveries hangs.

Everything is real: a listening socket that never answers, ``celery -A settle worker``
on the default queue and another with ``-Q`` the webhook queue, beat, Redis, PostgreSQL,
the live server's host API and a worker process SIGKILLed after its provider committed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.actors import COMMAND_LINE
from recovery.models import Dispatch
from tests.support.live import (
    Procs,
    Settle,
    assert_audit_intact,
    assert_nobody_resumed,
    assert_recovered_receipt,
    crash,
    state_of,
    transitions_of,
    wait_until,
)
from tests.support.webhook_receiver import Silent, silent_serve
from webhooks.endpoints import webhook_endpoint_add
from webhooks.models import WebhookMessage

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ENDPOINTS = 5  # endpoints of the fleet's host, all on the silent receiver
FLOOD = 30  # operations approved through the host API: ENDPOINTS messages each
# Lease lapsed → released by the sweeper: about 2 s when the default queue's worker is
# free (beat sweeps every second here); a worker held by a hanging delivery task takes 30 s
# or more per task.
SETTLE_BOUND = 15.0
# One operation's registration and approval through the host API (four requests).
API_BOUND = 5.0


@pytest.fixture
def silent() -> Iterator[Silent]:
    yield from silent_serve()


def test_a_receiver_that_never_answers_slows_neither_the_sweep_nor_the_host_api(
    settle: Settle,
    procs: Procs,
    make_provider: Any,
    silent: Silent,
    celery_env: dict[str, str | None],
    celery_procs: Any,
    settings: Any,
) -> None:
    settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE = True
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_env["SETTLE_CELERY_QUEUE"]
    settings.SETTLE_WEBHOOK_QUEUE = celery_env["SETTLE_WEBHOOK_QUEUE"]  # the live server's nudges
    env = {**celery_env, "SETTLE_WEBHOOKS_ALLOW_PRIVATE": "true", "SETTLE_WEBHOOK_SECONDS": "1"}
    provider = make_provider("sqlite", lease_seconds=1)
    for n in range(ENDPOINTS):
        webhook_endpoint_add(host_name="fleet-a", url=f"{silent.url}/{n}", actor=COMMAND_LINE)
    worker = celery_procs("worker", env)
    webhooks = celery_procs("webhooks", env)
    celery_procs("beat", env)

    # The flood, through the host API: every approval writes a message to each endpoint
    # and its commit nudges a delivery; the deliveries hang on the silent receiver.
    slowest = 0.0
    for n in range(FLOOD):
        started = time.monotonic()
        settle.approved(f"flood-{n:03d}", provider.name)
        slowest = max(slowest, time.monotonic() - started)
    wait_until(lambda: silent.accepted > 0, 30, "deliveries hanging on the silent receiver")

    key = "stranded-during-the-flood"
    started = time.monotonic()
    settle.approved(key, provider.name)
    slowest = max(slowest, time.monotonic() - started)
    crash(procs, key, provider, "after_effect")  # dispatched, effect committed, worker dead
    lease = Dispatch.objects.get(operation__key=key).lease_expires_at
    wait_until(lambda: state_of(key) == "released", 60, f"{key} released by the sweeper")
    released_at = transitions_of(key, "evidence_match")[0].at
    lag = (released_at - lease).total_seconds()
    print(
        f"\nwith {silent.accepted} deliveries hanging: lease lapsed → released in {lag:.2f} s; "
        f"the slowest registration and approval took {slowest:.2f} s"
    )
    assert lag <= SETTLE_BOUND, lag
    assert slowest <= API_BOUND, slowest

    # The deliveries were hanging all along, on the webhook worker alone.
    pending = WebhookMessage.objects.filter(status="pending").count()
    assert pending >= FLOOD * ENDPOINTS and not WebhookMessage.objects.filter(status="delivered")
    assert "Task webhooks.tasks.webhooks_deliver[" in webhooks.log()
    assert "Task webhooks.tasks.webhooks_deliver[" not in worker.log()
    assert provider.effects(key) == 1
    assert_recovered_receipt(key)
    assert_nobody_resumed(key)
    assert_audit_intact()
