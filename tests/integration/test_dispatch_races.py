"""Many real processes racing for one permit, and a permit expiring while consumption waits.

Racers are started first and wait on a barrier file after printing ``ready``, so every
process is up before any of them sends its request.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from audit.models import AuditEvent
from dbsql.clock import db_now
from recovery.models import Dispatch
from tests.support.live import (
    Procs,
    Settle,
    assert_audit_intact,
    operation,
    permit_events,
    permit_of,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


# -- 4. twelve resumes, fifty dispatches --------------------------------------------------


def test_twelve_fresh_processes_resuming_at_once_dispatch_exactly_once(
    settle: Settle, procs: Procs, make_provider: Any
) -> None:
    # A long lease: every loser must find the winner's dispatch alive ("in_progress", and
    # asked to come back once the lease may have ended).
    provider = make_provider("sqlite", lease_seconds=60)
    key = "race-resume"
    settle.approved(key, provider.name)
    go = procs.go_file()
    report_gate = procs.go_file().with_name("report-gate")
    workers = [
        procs.start(
            key=key,
            provider=provider,
            extra=["--go-file", str(go), "--report-gate", str(report_gate)],
        )
        for _ in range(12)
    ]
    procs.release(workers, go)

    answers = {worker.name: worker.answer for worker in workers}
    assert all(answer["status"] == 200 for answer in answers.values()), answers
    decisions = Counter(answer["body"]["decision"] for answer in answers.values())
    assert decisions == {"dispatch": 1, "in_progress": 11}, answers
    winners = [w for w in workers if answers[w.name]["body"]["decision"] == "dispatch"]
    (winner,) = winners
    assert answers[winner.name]["body"]["fencing_token"]
    for worker in workers:
        if worker is not winner:
            body = dict(answers[worker.name]["body"])
            assert 1 <= body.pop("retry_after") <= 60, answers[worker.name]
            assert body == {"decision": "in_progress", "state": "dispatched", "recovered": False}
            worker.assert_clean_exit()
            assert "effect_committed" not in worker.event_names()

    # Only now may the winner report: every loser answered while the dispatch was live.
    winner.wait_for("awaiting_report_gate")
    report_gate.touch()
    winner.assert_clean_exit()
    reported = winner.wait_for("reported")
    assert reported["status"] == 200, reported
    assert reported["body"] == {"applied": True, "state": "released", "receipt": "succeeded"}

    assert provider.effects(key) == 1
    assert Dispatch.objects.filter(operation__key=key).count() == 1
    assert Dispatch.objects.get(operation__key=key).worker == winner.name
    assert permit_events(key, "consumed") == 1
    # Losers that still saw "approved" tried the permit and were refused, on the record.
    refused = permit_events(key, "refused")
    assert refused == permit_events(key, "refused", "already_consumed") <= 11
    receipt = Dispatch.objects.get(operation__key=key)
    assert (receipt.receipt_status, receipt.receipt_recovered) == ("succeeded", False)
    assert operation(key).state == "released"
    assert_audit_intact()


def test_fifty_processes_dispatching_one_permit_yield_one_dispatch_and_49_refusals(
    settle: Settle, procs: Procs, make_provider: Any, settings: Any
) -> None:
    # One window for the whole race, so that its lines are known: N one by one, one summary.
    settings.SETTLE_REFUSAL_WINDOW_SECONDS = 10**9
    recorded = settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE
    provider = make_provider("sqlite", lease_seconds=60)
    key = "race-dispatch"
    permit_id = settle.approved(key, provider.name)
    go = procs.go_file()
    workers = [
        procs.start(key=key, mode="dispatch", extra=["--go-file", str(go)]) for _ in range(50)
    ]
    procs.release(workers, go)

    for worker in workers:
        worker.assert_clean_exit()
    answers = [worker.answer for worker in workers]
    statuses = Counter(answer["status"] for answer in answers)
    assert statuses == {200: 1, 409: 49}, statuses
    (won,) = [a for a in answers if a["status"] == 200]
    assert won["body"]["permit_id"] == permit_id and won["body"]["fencing_token"]
    for answer in answers:
        if answer["status"] == 409:
            assert answer["body"]["error"] == "already_consumed", answer
            assert answer["body"]["execution_state"] == "dispatched", answer

    assert Dispatch.objects.filter(operation__key=key).count() == 1
    assert Dispatch.objects.get().fencing_token == won["body"]["fencing_token"]
    assert permit_of(key).status == "consumed"
    assert permit_events(key, "consumed") == 1
    assert permit_events(key, "refused") == 49  # every refusal on the record
    assert permit_events(key, "refused", "already_consumed") == 49
    audit = AuditEvent.objects.filter(operation_key=key, kind="consume_refused").count()
    assert audit == min(49, recorded + 1)  # N one by one, then one for the summary
    assert operation(key).state == "dispatched"
    assert_audit_intact()


# -- 6. expiry while consumption waits ----------------------------------------------------


@contextlib.contextmanager
def operation_row_locked(key: str) -> Iterator[None]:
    """Hold the lock a concurrent dispatch must wait for, from a separate raw connection.

    PostgreSQL: ``SELECT ... FOR UPDATE`` on the operation row. SQLite (where the app's
    transactions are ``BEGIN IMMEDIATE``): the database's write lock. Rolled back on exit.
    """
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        raw = psycopg.connect(
            dbname=settings["NAME"],
            user=settings["USER"] or None,
            password=settings["PASSWORD"] or None,
            host=settings["HOST"] or None,
            port=settings["PORT"] or None,
        )
        try:
            with raw.cursor() as cursor:
                cursor.execute(
                    "SELECT id FROM recovery_operation WHERE key = %s FOR UPDATE", (key,)
                )
                assert cursor.fetchone() is not None
            yield
        finally:
            raw.rollback()
            raw.close()
    else:
        lite = sqlite3.connect(settings["NAME"], isolation_level=None, timeout=10)
        try:
            lite.execute("BEGIN IMMEDIATE")
            yield
        finally:
            lite.execute("ROLLBACK")
            lite.close()


def waiting_on_locks() -> int:
    """PostgreSQL backends of this database blocked on a lock right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def test_permit_expiring_while_consumption_waits_on_the_lock_prevents_dispatch(
    settle: Settle, procs: Procs, make_provider: Any
) -> None:
    provider = make_provider("sqlite", lease_seconds=60)
    key = "race-expiry"
    settle.register(key, provider.name)
    go = procs.go_file()
    worker = procs.start(key=key, mode="dispatch", extra=["--go-file", str(go)])
    worker.wait_for("ready")

    permit_id = settle.approve(key, ttl_seconds=2)["permit_id"]
    expires_at = permit_of(key).expires_at
    with operation_row_locked(key):
        go.touch()
        worker.wait_for("request")
        if connection.vendor == "postgresql":
            deadline = time.monotonic() + 10
            while not waiting_on_locks():
                assert time.monotonic() < deadline, "the dispatch never waited on the lock"
                time.sleep(0.02)
        else:
            time.sleep(0.3)  # let the request reach the server and queue on the lock
        # The request is in and waiting while the permit is still valid...
        assert db_now() < expires_at, "the machine was too slow to test expiry mid-wait"
        # ...and it stays blocked until the permit has expired by the database's clock.
        deadline = time.monotonic() + 10
        while db_now() <= expires_at:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.1)
        assert "answer" not in worker.event_names()
        assert worker.popen.poll() is None, "the dispatch did not wait for the lock"

    worker.assert_clean_exit()
    answer = worker.answer
    assert answer["status"] == 409, answer
    assert answer["body"]["error"] == "expired", answer
    assert not Dispatch.objects.filter(operation__key=key).exists()
    permit = permit_of(key)
    assert str(permit.id) == permit_id
    assert (permit.status, permit.consumed_at) == ("expired", None)
    assert permit_events(key, "consumed") == 0
    assert permit_events(key, "expired") == 1
    assert permit_events(key, "refused", "expired") == 1
    assert operation(key).state == "expired"
    assert AuditEvent.objects.filter(
        operation_key=key, kind="transition", data__event="expire", data__to="expired"
    ).exists()
    assert_audit_intact()
