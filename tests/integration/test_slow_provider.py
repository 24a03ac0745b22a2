"""A provider that hangs holds background workers, never web workers: resume answers at once.

gunicorn with two workers, as in production but fewer than the resumes that arrive at
once. Four crashed operations of a provider whose lookups hang until its timeout are
resumed at once: each answers ``in_progress`` at once, having queued its lookup for the
background worker (a real Celery worker with four pool processes, ``lookup_worker``).
While those lookups hang in the background, another operation of another provider runs
its whole lifecycle without waiting, and resuming the hung ones again answers at once
and queues nothing more. Each hanging lookup ends at the provider's timeout, as
``unavailable``, and the next resume answers from that.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals.services.approvers import approver_create
from harness.gunicorn import database_url, gunicorn_running
from harness.providers import (
    digest_of,
    http_provider_control,
    http_provider_start,
    http_provider_stop,
    sqlite_provider_init,
)
from recovery.models import Evidence, LookupAttempt, Operation
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.flow import PARAMS
from tests.support.live import Http, LookupWorker, wait_lease_lapsed

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

TIMEOUT = 3  # seconds the hanging provider is given per lookup
HUNG = 4  # crashed operations of the hanging provider, resumed at once
AT_ONCE = 1.0  # seconds within which an answer that waits for nothing arrives
QUEUED = {"decision": "in_progress", "state": "unknown", "recovered": False, "retry_after": 1}


def _ok(answer: tuple[int, dict[str, Any]], step: str) -> dict[str, Any]:
    status, body = answer
    assert 200 <= status < 300, (step, status, body)
    return body


def _approved(host: Http, approver: Http, key: str, provider: str) -> dict[str, Any]:
    body = {"key": key, "action": "payment.send", "provider": provider, "params": PARAMS}
    _ok(host.post("/api/v1/operations", body), f"{key} register")
    approval = _ok(host.post(f"/api/v1/operations/{key}/approvals"), f"{key} open")
    path = f"/api/v1/approvals/{approval['approval_id']}/decision"
    decision = {"decision": "approve", "params_digest": digest_of(PARAMS)}
    _ok(approver.post(path, decision), f"{key} approve")
    dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
    return _ok(host.post(f"/api/v1/operations/{key}/dispatch", dispatch), f"{key} dispatch")


def _resume_all_at_once(host: Http, keys: list[str]) -> dict[str, tuple[float, dict[str, Any]]]:
    """Resume every key in a thread of its own, all at once; (seconds, answer) per key."""
    answers: dict[str, tuple[float, dict[str, Any]]] = {}
    barrier = threading.Barrier(len(keys))

    def resume(key: str) -> None:
        barrier.wait(timeout=10)
        started = time.monotonic()
        body = _ok(host.post(f"/api/v1/operations/{key}/resume", {"worker": "w2"}), key)
        answers[key] = (time.monotonic() - started, body)

    threads = [threading.Thread(target=resume, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == len(keys), answers
    return answers


def _attempts(status: str) -> int:
    return LookupAttempt.objects.filter(operation__provider__name="slow", status=status).count()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_resumes_against_a_hanging_provider_answer_at_once_and_its_lookups_hang_in_the_background(
    tmp_path: Path, lookup_worker: LookupWorker
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    _, host_token = host_create(name="fleet-a")
    _, approver_token = approver_create(name="alice-phone", all_providers=True)
    process, url = http_provider_start(tmp_path, "secret")
    orders = tmp_path / "orders.sqlite3"
    sqlite_provider_init(orders)
    provider_configure(
        name="slow", adapter="http", url=url, secret="secret", lease_seconds=1,
        timeout_seconds=TIMEOUT,
    )  # fmt: skip
    provider_configure(name="orders", adapter="sqlite", path=str(orders), lease_seconds=60)
    keys = [f"hung-{n}" for n in range(HUNG)]
    try:
        with gunicorn_running(
            database_url=database_url(connection.settings_dict),
            log_path=tmp_path / "gunicorn.log",
            workers=2,
            env={"SETTLE_CELERY_QUEUE": lookup_worker.queue},
        ) as server:
            host, approver = Http(server.url, host_token), Http(server.url, approver_token)
            for key in keys:
                _approved(host, approver, key, "slow")  # and the worker dies: no report
            for key in keys:
                wait_lease_lapsed(key)
            http_provider_control(url, "slow", delay=30)

            # Every resume answers at once: its lookup is queued, not run in the request.
            first = _resume_all_at_once(host, keys)
            for key, (seconds, body) in first.items():
                assert body == QUEUED and seconds < AT_ONCE, (key, first[key])

            # The background worker takes the lookups up, and they hang at the provider.
            _wait(lambda: _attempts("running") == HUNG, 10, "every lookup running")

            # Meanwhile another provider's operation goes through its whole lifecycle...
            steps: list[float] = []
            started = time.monotonic()
            token = _approved(host, approver, "unrelated", "orders")["fencing_token"]
            steps.append(time.monotonic() - started)
            report = {"fencing_token": token, "outcome": "committed"}
            started = time.monotonic()
            result = _ok(host.post("/api/v1/operations/unrelated/result", report), "report")
            steps.append(time.monotonic() - started)
            assert result["state"] == "released"
            # ...and resuming the hung operations again answers at once, queueing nothing.
            again = _resume_all_at_once(host, keys)
            for key, (seconds, body) in again.items():
                assert body == QUEUED and seconds < AT_ONCE, (key, again[key])
            assert _attempts("running") == HUNG, "the lookups ended before the lifecycle did"

            # Each hanging lookup is given up at the provider's timeout.
            _wait(lambda: _attempts("finished") == HUNG, TIMEOUT + 10, "every lookup finished")
            after = {key: body for key, (_, body) in _resume_all_at_once(host, keys).items()}
    finally:
        http_provider_stop(process)

    assert max(steps) < AT_ONCE, steps
    attempts = LookupAttempt.objects.filter(operation__provider__name="slow")
    assert sorted(attempts.values_list("operation__key", flat=True)) == keys  # one each
    for attempt in attempts:
        assert attempt.trigger == "resume" and attempt.finished_at is not None
        held = (attempt.finished_at - attempt.started_at).total_seconds()
        assert TIMEOUT - 0.5 <= held < TIMEOUT + 2, (attempt.operation.key, held)
    verdicts = Evidence.objects.filter(operation__key__in=keys).values_list("verdict", flat=True)
    assert sorted(verdicts) == ["unavailable"] * HUNG
    # The next resume answers from what the lookup found: unknown, until the next is due.
    for key, body in after.items():
        assert body["decision"] == "unknown" and body["state"] == "unknown", (key, body)
        assert body["retry_after"] >= 1, (key, body)
    assert Operation.objects.get(key="unrelated").state == "released"
