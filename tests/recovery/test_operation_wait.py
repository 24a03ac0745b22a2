"""``GET /api/v1/operations/{key}?wait=N``: a read held until the approval is decided.

In process here (Django's test client); ``tests/integration/test_operation_wait_live.py``
holds reads on gunicorn's threads while the approver decides over HTTP.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from recovery.models import Operation
from recovery.services import waits

pytestmark = pytest.mark.django_db

PATH = "/api/v1/operations/op-1"


def _awaiting(flow) -> None:
    flow.register()
    flow.host_api.post("/api/v1/operations/op-1/approvals")


@pytest.mark.parametrize("wait", ["0", "26", "abc", "1.5", "-1", "", "007", "07", "+5", "٣"])
def test_a_wait_that_is_not_whole_seconds_from_1_to_25_is_refused(flow, wait, settings):
    settings.SETTLE_APPROVAL_WAITS = 2
    flow.register()
    response = flow.host_api.get(f"{PATH}?wait={wait}")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_wait"


def test_a_decided_operation_is_answered_at_once(flow, settings):
    settings.SETTLE_APPROVAL_WAITS = 2
    flow.approved()
    began = time.monotonic()
    response = flow.host_api.get(f"{PATH}?wait=25")
    assert response.status_code == 200
    assert response.json()["state"] == "approved"
    assert time.monotonic() - began < 5  # not held: far from the 25 s asked


def test_a_process_that_holds_no_reads_answers_at_once(flow, settings):
    settings.SETTLE_APPROVAL_WAITS = 0
    _awaiting(flow)
    began = time.monotonic()
    response = flow.host_api.get(f"{PATH}?wait=25")
    assert response.json()["state"] == "awaiting_approval"
    assert time.monotonic() - began < 5


def test_an_undecided_approval_is_held_for_the_wait_then_answered_as_it_is(flow, settings):
    settings.SETTLE_APPROVAL_WAITS = 1
    _awaiting(flow)
    began = time.monotonic()
    response = flow.host_api.get(f"{PATH}?wait=1")
    assert response.status_code == 200
    assert response.json()["state"] == "awaiting_approval"
    assert time.monotonic() - began >= 1


@pytest.mark.django_db(transaction=True)
def test_a_held_read_answers_when_another_connection_decides(flow, settings):
    """The approver decides on another thread (its own database connection): the read
    held for 20 s answers with the decision, long before."""
    settings.SETTLE_APPROVAL_WAITS = 1
    _awaiting(flow)
    answered: list[tuple[float, str]] = []

    def read() -> None:
        try:
            response = flow.host_api.get(f"{PATH}?wait=20")
            answered.append((time.monotonic(), response.json()["state"]))
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)
    assert not answered  # held
    decided = time.monotonic()
    flow.approve()
    reader.join(timeout=20)
    assert answered and answered[0][1] == "approved"
    assert answered[0][0] - decided < 5


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_decision_notifies_its_operation_and_a_policy_opening_nobody(flow):
    listener = connection.get_new_connection(connection.get_connection_params())
    listener.autocommit = True
    listener.execute(f"LISTEN {waits.CHANNEL}")
    try:
        flow.approved()  # registered, then approved by a person: another transaction
        notes = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        assert notes == [str(Operation.objects.get(key="op-1").pk)]
        # Awaiting approval and decided in one transaction: no NOTIFY.
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "UPDATE recovery_operation SET state = 'awaiting_approval' WHERE key = 'op-1'"
            )
            cursor.execute("UPDATE recovery_operation SET state = 'approved' WHERE key = 'op-1'")
            cursor.execute("COMMIT")
        assert list(listener.notifies(timeout=1, stop_after=1)) == []
    finally:
        listener.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_listener_whose_connection_is_killed_answers_the_record_not_an_error(flow, settings):
    """The held read's own connection terminated by the server: it answers at once with
    the operation as it is (still awaiting), not a 500, long before its 20 s."""
    settings.SETTLE_APPROVAL_WAITS = 1
    _awaiting(flow)
    answered: list[tuple[float, int, dict]] = []

    def read() -> None:
        try:
            response = flow.host_api.get(f"{PATH}?wait=20")
            answered.append((time.monotonic(), response.status_code, response.json()))
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    listening = "SELECT pid FROM pg_stat_activity WHERE query = %s AND pid <> pg_backend_pid()"
    with connection.cursor() as cursor:
        for _ in range(100):  # until the read listens (at most 10 s)
            cursor.execute(listening, [f"LISTEN {waits.CHANNEL}"])
            pids = [row[0] for row in cursor.fetchall()]
            if pids:
                break
            time.sleep(0.1)
        assert pids, "the held read never listened"
        killed = time.monotonic()
        cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
    reader.join(timeout=20)
    (at, status, record) = answered[0]
    assert status == 200 and record["state"] == "awaiting_approval"
    assert at - killed < 5
