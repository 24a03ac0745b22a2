"""Background recovery with the real components: Celery workers and beat, Redis, PostgreSQL.

Nobody calls ``resume`` here. Workers that die are real processes killed with SIGKILL
(``tests/procs/worker.py``); ``celery -A settle worker`` and ``celery -A settle beat``
run as in production, against the test database and the broker the environment names
(``CELERY_BROKER_URL``, Redis), each test on a queue of its own. Two sweeps at once run
in threads with their own PostgreSQL sessions.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import kombu
import pytest
from django.db import connection, connections
from django.utils import timezone

from approvals.services.approvers import approver_create
from audit.models import AuditCheckpoint, AuditVerification
from audit.verify_walk import audit_verify
from common.actors import Actor
from dbsql.clock import db_now
from harness.celery_procs import (
    REPO_ROOT,
    redis_start,
)
from harness.gunicorn import gunicorn_running
from harness.providers import digest_of, http_provider_control, sqlite_provider_commit
from recovery.models import Dispatch, Evidence, LookupAttempt
from recovery.services.credentials import host_create
from recovery.services.dispatch import operation_dispatch
from recovery.services.permits import approval_decision, approval_open
from recovery.services.registration import operation_register
from recovery.services.sweep import sweep
from settle.celery import app as celery_app
from tests.support.celery_fixtures import test_database_url
from tests.support.flow import PARAMS
from tests.support.live import (
    Http,
    Procs,
    Settle,
    assert_audit_intact,
    assert_nobody_resumed,
    assert_one_dispatch_one_consumption,
    assert_recovered_receipt,
    crash,
    operation,
    state_of,
    transitions_of,
    wait_until,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

LOOKUP_TASK = "recovery.tasks.lookup_attempt"


def _wait_lease_lapsed(key: str) -> None:
    dispatch = Dispatch.objects.filter(operation__key=key)
    wait_until(lambda: dispatch.get().lease_expires_at < db_now(), 10, f"{key}'s lease lapsed")


# -- 1. a dead worker's operation settles by itself ------------------------------------------


def test_a_stranded_operation_is_released_by_the_sweeper_with_nobody_calling_resume(
    settle: Settle, procs: Procs, make_provider: Any, celery_env: Any, celery_procs: Any
) -> None:
    provider = make_provider("sqlite", lease_seconds=1)
    celery_procs("worker", celery_env)
    celery_procs("beat", celery_env)
    key = "swept-commit"
    settle.approved(key, provider.name)

    crash(procs, key, provider, "after_effect")
    lease = Dispatch.objects.get(operation__key=key).lease_expires_at
    wait_until(lambda: state_of(key) == "released", 30, f"{key} released by the sweeper")
    released_at = transitions_of(key, "evidence_match")[0].at
    lag = (released_at - lease).total_seconds()
    print(f"\nlease lapsed → released by the sweeper in {lag:.2f} s")
    assert lag <= 5.0, lag  # lease + a few seconds: beat sweeps every second here

    assert provider.effects(key) == 1
    assert_one_dispatch_one_consumption(key)
    assert_recovered_receipt(key)
    [lost] = transitions_of(key, "lease_lost")
    assert lost.data["reason"] == "no heartbeat or report before the lease expired"
    assert_nobody_resumed(key)
    assert_audit_intact()


# -- 2. the same task twice ------------------------------------------------------------------


def test_the_same_lookup_task_delivered_twice_changes_state_once(
    settle: Settle,
    procs: Procs,
    make_provider: Any,
    celery_env: Any,
    celery_procs: Any,
    celery_queue: str,
) -> None:
    provider = make_provider("journal", lease_seconds=1)
    worker = celery_procs("worker", celery_env)
    key = "swept-twice"
    settle.approved(key, provider.name)
    crash(procs, key, provider, "after_effect")
    _wait_lease_lapsed(key)

    def publish_twice(attempt_id: int) -> None:
        for _ in range(2):
            celery_app.send_task(LOOKUP_TASK, args=[attempt_id], queue=celery_queue)

    report = sweep(publish=publish_twice)
    assert report.published == 1 and len(report.lookups_queued) == 1
    worker.wait_for_log(f"Task {LOOKUP_TASK}[", timeout=30, count=4)  # 2 received, 2 done
    worker.wait_for_log("succeeded in", timeout=30, count=2)

    assert state_of(key) == "released"
    assert len(transitions_of(key, "evidence_match")) == 1
    assert Evidence.objects.filter(operation__key=key).count() == 1
    assert LookupAttempt.objects.filter(operation__key=key).count() == 1
    assert_recovered_receipt(key)
    assert_audit_intact()


# -- 3. two sweepers at once -----------------------------------------------------------------


def _stranded(count: int, provider: str) -> list[str]:
    """``count`` dispatched operations whose worker went quiet (their leases lapsed)."""
    host, _ = host_create(name="fleet-s")
    keys = []
    for n in range(count):
        key = f"storm-{n:03d}"
        op, _ = operation_register(
            host=host, key=key, action="payment.send", provider_name=provider, params=PARAMS
        )
        approval, _ = approval_open(operation=op, host=host)
        approval_decision(
            approval_id=approval.id,
            approve=True,
            ttl_seconds=300,
            decided_by=Actor.system("test"),
            reviewed_digest=digest_of(PARAMS),
        )
        outcome = operation_dispatch(
            operation=op,
            worker="w",
            presented_digest=digest_of(PARAMS),
            actor=Actor("host", "1", "fleet-s"),
        )
        assert outcome.dispatch is not None
        keys.append(key)
    Dispatch.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    return keys


def test_two_sweeps_at_once_never_handle_one_operation_twice(make_provider: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite serialises writers instead")
    provider = make_provider("sqlite", lease_seconds=1)
    keys = _stranded(60, provider.name)
    barrier = threading.Barrier(2)
    reports: dict[int, Any] = {}
    published: dict[int, list[int]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def sweeper(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            # Small batches, so that the two interleave over many transactions.
            reports[n] = sweep(publish=published[n].append, batch_size=4, max_batches=100)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweeper, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors

    lapsed = [reports[0].leases_lapsed, reports[1].leases_lapsed]
    queued = [reports[0].lookups_queued, reports[1].lookups_queued]
    print(f"\nsweeper 0 moved {len(lapsed[0])}, sweeper 1 moved {len(lapsed[1])}")
    assert not set(lapsed[0]) & set(lapsed[1])
    assert len(lapsed[0]) + len(lapsed[1]) == len(keys)
    assert not set(queued[0]) & set(queued[1])
    assert sorted(published[0] + published[1]) == sorted(queued[0] + queued[1])
    per_operation = Counter(
        LookupAttempt.objects.filter(status="queued").values_list("operation__key", flat=True)
    )
    assert per_operation == Counter(dict.fromkeys(keys, 1))
    for key in keys:
        assert len(transitions_of(key, "lease_lost")) == 1, key
        assert state_of(key) == "unknown"
    assert_audit_intact()


# -- 4. the Celery worker killed mid-lookup ---------------------------------------------------


def test_a_worker_killed_mid_lookup_completes_the_lookup_after_redelivery_once(
    settle: Settle,
    procs: Procs,
    make_provider: Any,
    celery_env: Any,
    celery_procs: Any,
    celery_queue: str,
) -> None:
    provider = make_provider("http", lease_seconds=1)
    worker = celery_procs("worker", celery_env)
    key = "swept-killed"
    settle.approved(key, provider.name)
    crash(procs, key, provider, "after_effect")
    _wait_lease_lapsed(key)
    http_provider_control(provider.url, "slow", delay=4)  # within its 5 s timeout

    report = sweep(
        publish=lambda attempt_id: celery_app.send_task(
            LOOKUP_TASK, args=[attempt_id], queue=celery_queue
        )
    )
    [attempt_id] = report.lookups_queued
    wait_until(
        lambda: LookupAttempt.objects.get(pk=attempt_id).status == "running",
        30,
        "the lookup started",
    )
    time.sleep(1.0)  # the pool process now waits for the provider's answer
    [child] = worker.children()
    os.kill(child, 9)
    http_provider_control(provider.url, "normal")

    # The pool process's message is requeued (task_reject_on_worker_lost), delivered
    # again, finds the attempt's lease alive, waits it out and then runs it.
    waited = wait_until(lambda: state_of(key) == "released", 60, f"{key} released after redelivery")
    print(f"\nreleased {waited:.1f} s after the kill (the lookup lease is 10 s)")
    log = worker.log()
    assert "WorkerLostError" in log or "Worker exited prematurely" in log
    assert f"Task {LOOKUP_TASK}[" in log and "retry: Retry in" in log  # waited for the lease
    assert len(transitions_of(key, "evidence_match")) == 1
    assert Evidence.objects.filter(operation__key=key).count() == 1
    [attempt] = LookupAttempt.objects.filter(operation__key=key)
    assert (attempt.pk, attempt.status) == (attempt_id, "finished")
    assert provider.effects(key) == 1
    assert_recovered_receipt(key)
    assert_audit_intact()


# -- 5. Redis down: the host API answers, nothing is lost -----------------------------------


def test_with_redis_down_the_host_api_answers_and_the_sweep_resumes_when_it_is_back(
    make_provider: Any,
    celery_env: Any,
    celery_procs: Any,
    celery_queue: str,
    tmp_path: Path,
    settings: Any,
) -> None:
    # Lookups queued by this process and by gunicorn's resume: queued afresh soon.
    settings.SETTLE_LOOKUP_QUEUE_SECONDS = 2
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()
    redis, port = redis_start(redis_dir)
    private = f"redis://127.0.0.1:{port}/0"
    env = {**celery_env, "CELERY_BROKER_URL": private}
    provider = make_provider("sqlite", lease_seconds=1)
    _, host_token = host_create(name="fleet-r")
    _, approver_token = approver_create(name="bob-phone", all_providers=True)
    try:
        with gunicorn_running(
            database_url=celery_env["DATABASE_URL"],
            log_path=tmp_path / "gunicorn.log",
            workers=2,
            env={
                "CELERY_BROKER_URL": private,
                "SETTLE_CELERY_QUEUE": celery_queue,
                "SETTLE_LOOKUP_QUEUE_SECONDS": "2",
            },
        ) as server:
            celery_procs("worker", env)
            celery_procs("beat", env)
            redis.stop()  # the broker is gone

            host, approver = Http(server.url, host_token), Http(server.url, approver_token)
            slowest = 0.0
            keys = (
                ("while-down-ok", True),
                ("while-down-dead", False),
                ("while-down-resumed", False),
            )
            for key, report in keys:
                started = time.monotonic()
                body = {"key": key, "action": "payment.send", "provider": provider.name}
                status, _ = host.post("/api/v1/operations", {**body, "params": PARAMS})
                assert status == 201
                status, approval = host.post(f"/api/v1/operations/{key}/approvals")
                assert status == 201
                status, _ = approver.post(
                    f"/api/v1/approvals/{approval['approval_id']}/decision",
                    {"decision": "approve", "params_digest": digest_of(PARAMS)},
                )
                assert status == 200
                status, dispatched = host.post(
                    f"/api/v1/operations/{key}/dispatch",
                    {"worker": "w1", "params_digest": digest_of(PARAMS)},
                )
                assert status == 200
                sqlite_provider_commit(
                    provider.path, operation_key=key, params=PARAMS, reference=f"r-{key}"
                )
                if report:
                    status, result = host.post(
                        f"/api/v1/operations/{key}/result",
                        {"fencing_token": dispatched["fencing_token"], "outcome": "committed"},
                    )
                    assert status == 200 and result["state"] == "released"
                slowest = max(slowest, time.monotonic() - started)
            print(f"\nwith Redis down, one lifecycle took at most {slowest:.2f} s")
            assert slowest < 5.0

            # A resume while the broker is down answers: its lookup is queued in the
            # database; the message that should start it never left.
            resumed = "while-down-resumed"
            _wait_lease_lapsed(resumed)
            started = time.monotonic()
            status, answer = host.post(f"/api/v1/operations/{resumed}/resume", {"worker": "w2"})
            took = time.monotonic() - started
            print(f"a resume with the broker down took {took:.2f} s")
            assert status == 200 and took < 5.0, (status, answer, took)
            assert answer == {
                "decision": "in_progress",
                "state": "unknown",
                "recovered": False,
                "retry_after": 1,
            }
            assert LookupAttempt.objects.get(operation__key=resumed).status == "queued"

            # A sweep while the broker is down commits its work and publishes nothing.
            dead = "while-down-dead"
            _wait_lease_lapsed(dead)
            down = kombu.Connection(private, connect_timeout=2)
            started = time.monotonic()
            report = sweep(
                publish=lambda attempt_id: celery_app.send_task(
                    LOOKUP_TASK, args=[attempt_id], queue=celery_queue, connection=down
                )
            )
            print(f"a sweep with the broker down took {time.monotonic() - started:.2f} s")
            assert report.publish_failed and report.published == 0
            assert state_of(dead) == "unknown"
            assert LookupAttempt.objects.get(operation__key=dead).status == "queued"

            redis, _ = redis_start(redis_dir, port)  # back, empty: the messages never were
            waited = wait_until(
                lambda: state_of(dead) == state_of(resumed) == "released",
                90,
                "released once Redis is back",
            )
            print(f"released {waited:.1f} s after Redis came back")
            status, answer = host.post(f"/api/v1/operations/{resumed}/resume", {"worker": "w2"})
            assert status == 200, answer
            assert answer == {"decision": "released", "state": "released", "recovered": True}
    finally:
        redis.stop()

    assert state_of("while-down-ok") == "released"
    for key in (dead, resumed):
        assert_recovered_receipt(key)
        statuses = Counter(
            LookupAttempt.objects.filter(operation__key=key).values_list("status", flat=True)
        )
        assert statuses["finished"] == 1 and statuses["abandoned"] >= 1, (key, statuses)
        assert len(transitions_of(key, "evidence_match")) == 1
        assert operation(key).recovered is True
    assert_audit_intact()


# -- 6. the embedded default: no broker configured ------------------------------------------


def test_with_no_broker_configured_a_real_worker_and_beat_recover_through_the_filesystem(
    settle: Settle,
    procs: Procs,
    make_provider: Any,
    celery_procs: Any,
    tmp_path: Path,
    settings: Any,
) -> None:
    var = tmp_path / "var"
    env: dict[str, str | None] = {
        "CELERY_BROKER_URL": None,  # the embedded default: kombu's filesystem transport
        "SETTLE_VAR_DIR": str(var),
        "DATABASE_URL": test_database_url(),
        "SECRET_KEY": str(settings.SECRET_KEY),
        "SETTLE_AUDIT_KEY": str(settings.SETTLE_AUDIT_KEY),
        "SETTLE_SWEEP_SECONDS": "1",
    }
    provider = make_provider("sqlite", lease_seconds=1)
    celery_procs("worker", env)
    celery_procs("beat", env)
    key = "embedded-commit"
    settle.approved(key, provider.name)
    crash(procs, key, provider, "after_effect")

    wait_until(lambda: state_of(key) == "released", 30, f"{key} released by the sweeper")
    # The filesystem broker under the var dir carried the messages (its exchange table).
    assert (var / "broker" / "control" / "settle.exchange").exists()
    assert not (REPO_ROOT / "control").exists()
    assert_recovered_receipt(key)
    assert_nobody_resumed(key)
    assert_audit_intact()


def test_beat_signs_audit_checkpoints_and_verifies_the_log_on_schedule(
    settle: Settle,
    make_provider: Any,
    celery_env: dict[str, str | None],
    celery_procs: Any,
    tmp_path: Path,
    settings: Any,
) -> None:
    checkpoints = tmp_path / "checkpoints.jsonl"
    settings.SETTLE_AUDIT_CHECKPOINT_FILE = checkpoints  # verify_audit here reads the same
    env = {
        **celery_env,
        "SETTLE_AUDIT_CHECKPOINT_SECONDS": "1",
        "SETTLE_AUDIT_VERIFY_SECONDS": "2",
        "SETTLE_AUDIT_CHECKPOINT_FILE": str(checkpoints),
        "SETTLE_AUDIT_KEY": str(settings.SETTLE_AUDIT_KEY),
    }
    provider = make_provider("sqlite", lease_seconds=1)
    celery_procs("worker", env)
    celery_procs("beat", env)
    settle.approved("cp-1", provider.name)
    wait_until(lambda: AuditCheckpoint.objects.exists(), 30, "a first checkpoint by beat")
    first = AuditCheckpoint.objects.order_by("-number").first()
    assert first is not None and "cp-1" in first.heads
    settle.approved("cp-2", provider.name)  # events after it: the next one covers them
    wait_until(
        lambda: AuditCheckpoint.objects.filter(
            number__gt=first.number, heads__has_key="cp-2"
        ).exists(),
        30,
        "a later checkpoint covering cp-2",
    )
    lines = [json.loads(line) for line in checkpoints.read_text().splitlines()]
    assert [line["number"] for line in lines] == list(
        AuditCheckpoint.objects.order_by("number").values_list("number", flat=True)
    )
    assert list(audit_verify()) == []
    # Beat verifies the whole log too, and keeps the outcome for the audit trail page.
    wait_until(
        lambda: AuditVerification.objects.filter(ok=True).exists(), 30, "beat's verification"
    )
