"""One operation's open transaction never holds up another operation of the same provider.

A thread with a database connection of its own opens a transaction on operation A the
way a service call does: it locks A (``operation_lock``), appends to A's audit chain,
consumes A's permit and creates its dispatch (``operation_dispatch``), heartbeats it, so
that A's row, its permit, its new dispatch and receipt rows and uncommitted audit rows
are all held, and then waits. Meanwhile the main thread, with ``lock_timeout = 2s`` so
that any wait on A's locks fails fast (the API answers 503 then), drives operation B of
the same host and provider through its whole lifecycle over the host API, and operation
C through a crash released from the provider's evidence: resume queues the lookup, a real
Celery worker (``lookup_worker``) runs it, and resume is asked again until it settles.
Every step must answer 2xx in bounded time. Then A commits and every audit chain verifies.

The locks this relies on are the ones ``recovery.services`` documents (lock order): the
operation row only, ``FOR NO KEY UPDATE OF`` the operation, never its provider or host,
and a per-operation audit chain. Locking the provider with the operation (a plain
``select_for_update()`` with ``select_related("provider")``) makes B's registration wait
on A and this test fail with a lock timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from audit.chain import audit_append, audit_transaction
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from common.actors import Actor
from harness.providers import digest_of, sqlite_provider_commit
from recovery.models import Operation
from recovery.services.dispatch import operation_dispatch, operation_heartbeat
from recovery.services.locking import operation_lock
from tests.support.flow import Api
from tests.support.live import WAIT, LookupWorker, fleet_and_orders, wait_lease_lapsed

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}
LOCK_TIMEOUT = "2s"
STEP_LIMIT = 5.0  # seconds any single API call of B or C may take
HOLD_LIMIT = 120.0  # the holder gives up (and rolls back) if never released


class Holder:
    """Operation A's transaction, held open in a thread with its own connection."""

    def __init__(self, operation_pk: int) -> None:
        self.operation_pk = operation_pk
        self.holding = threading.Event()
        self.release = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="hold-A", daemon=True)

    def _run(self) -> None:
        try:
            with transaction.atomic():  # A's one database transaction
                # Written before the wait (uncommitted): the audit INSERT takes its locks.
                with audit_transaction():
                    locked = operation_lock(Operation.objects.get(pk=self.operation_pk))
                    audit_append(
                        kind="test", operation=locked, actor=Actor.system("test"), data={"n": 1}
                    )
                    outcome = operation_dispatch(
                        operation=locked,
                        worker="holder",
                        presented_digest=locked.params_digest,
                        actor=Actor.system("test"),
                    )
                    assert outcome.dispatch is not None, outcome
                # Buffered across the wait, as every service call's events are.
                with audit_transaction():
                    locked = operation_lock(locked)
                    operation_heartbeat(
                        operation=locked,
                        fencing_token=outcome.dispatch.fencing_token,
                        actor=Actor.system("test"),
                    )
                    audit_append(
                        kind="test", operation=locked, actor=Actor.system("test"), data={"n": 2}
                    )
                    self.holding.set()
                    if not self.release.wait(timeout=HOLD_LIMIT):
                        raise TimeoutError("operation A was never released")
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.holding.set()
            connection.close()

    def start(self) -> None:
        self.thread.start()
        assert self.holding.wait(timeout=30), "the holder did not take A's locks"
        assert not self.errors, self.errors

    def finish(self) -> None:
        self.release.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the holder did not finish"


@pytest.fixture
def holder_cleanup() -> Iterator[list[Holder]]:
    """Whatever happens, release the holder and reset the main connection's lock timeout."""
    holders: list[Holder] = []
    yield holders
    for holder in holders:
        holder.release.set()
        holder.thread.join(timeout=30)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


def _a_is_locked(pk: int) -> bool:
    """True if another transaction holds operation A's row lock (checked without waiting)."""
    try:
        with transaction.atomic():
            Operation.objects.select_for_update(nowait=True).get(pk=pk)
    except DatabaseError as exc:
        assert getattr(exc.__cause__, "sqlstate", "") == "55P03", exc  # lock_not_available
        return True
    return False


class Steps:
    """The host API through Django's test client, in this thread (so, this connection)."""

    def __init__(self, host: Api, approver: Api, provider: str) -> None:
        self.host, self.approver, self.provider = host, approver, provider
        self.timings: list[tuple[str, float]] = []

    def call(self, step: str, api: Api, path: str, body: Any = None) -> dict[str, Any]:
        started = time.monotonic()
        response = api.get(path) if body is None else api.post(path, body)
        elapsed = time.monotonic() - started
        self.timings.append((step, elapsed))
        assert 200 <= response.status_code < 300, (step, response.status_code, response.content)
        assert elapsed < STEP_LIMIT, (step, elapsed)
        return dict(response.json())

    def approved(self, key: str) -> None:
        body = {"key": key, "action": "payment.send", "provider": self.provider, "params": PARAMS}
        self.call(f"{key} register", self.host, "/api/v1/operations", body)
        opened = self.call(
            f"{key} open approval", self.host, f"/api/v1/operations/{key}/approvals", {}
        )
        decision = {"decision": "approve", "ttl_seconds": 300, "params_digest": digest_of(PARAMS)}
        path = f"/api/v1/approvals/{opened['approval_id']}/decision"
        self.call(f"{key} approve", self.approver, path, decision)

    def dispatch(self, key: str) -> str:
        body = {"worker": "w1", "params_digest": digest_of(PARAMS)}
        answer = self.call(f"{key} dispatch", self.host, f"/api/v1/operations/{key}/dispatch", body)
        return str(answer["fencing_token"])


def resume_polled(ask: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """Ask ``ask()`` (a resume) again after its ``retry_after`` while it is ``in_progress``.

    Not ``settle_client``: every request here goes through Django's test client in this
    thread, on the connection that must not wait for op-a's lock, and each is timed
    (``Steps.call``); the library speaks HTTP to a server. Returns every answer.
    """
    answers = [ask()]
    deadline = time.monotonic() + WAIT
    while answers[-1]["decision"] == "in_progress":
        wait = answers[-1]["retry_after"]
        assert time.monotonic() + wait <= deadline, f"in progress after {WAIT} s: {answers}"
        time.sleep(wait)
        answers.append(ask())
    return answers


def _chain(key: str) -> list[tuple[int, str]]:
    return list(
        AuditEvent.objects.filter(operation_key=key).order_by("seq").values_list("seq", "kind")
    )


def test_an_open_transaction_on_one_operation_holds_up_no_other(
    transactional_db: None,
    tmp_path: Path,
    holder_cleanup: list[Holder],
    lookup_worker: LookupWorker,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row-lock isolation between operations is checked on PostgreSQL only")
    host_token, approver_token, orders = fleet_and_orders(
        tmp_path, lease_seconds=2, timeout_seconds=5
    )
    steps = Steps(Api(host_token), Api(approver_token), "orders")

    steps.approved("op-a")
    op_a = Operation.objects.get(key="op-a")
    holder = Holder(op_a.pk)
    holder_cleanup.append(holder)
    holder.start()
    assert _a_is_locked(op_a.pk)
    steps.timings.clear()  # from here on: B and C only

    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    started = time.monotonic()

    # B: the whole lifecycle, same host, same provider, while A's transaction is open.
    steps.approved("op-b")
    token = steps.dispatch("op-b")
    steps.call(
        "op-b heartbeat", steps.host, "/api/v1/operations/op-b/heartbeat", {"fencing_token": token}
    )
    report = {"fencing_token": token, "outcome": "committed", "provider_reference": "ref-b"}
    answer = steps.call("op-b report", steps.host, "/api/v1/operations/op-b/result", report)
    assert answer["state"] == "released", answer

    # C: dispatched, committed at the provider, the worker dies; resume queues a lookup
    # and answers released once the background worker has found the evidence.
    steps.approved("op-c")
    steps.dispatch("op-c")
    sqlite_provider_commit(orders, operation_key="op-c", params=PARAMS, reference="ref-c")
    wait_lease_lapsed("op-c")
    path = "/api/v1/operations/op-c/resume"
    answers = resume_polled(lambda: steps.call("op-c resume", steps.host, path, {"worker": "w2"}))
    assert answers[0]["decision"] == "in_progress", answers
    assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
    steps.call("op-c record", steps.host, "/api/v1/operations/op-c")
    elapsed = time.monotonic() - started

    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone() == (LOCK_TIMEOUT,)  # it held for every step
    assert _a_is_locked(op_a.pk), "A's transaction ended before B and C were done"
    assert Operation.objects.get(pk=op_a.pk).state == "approved"  # A's change is not visible

    holder.finish()
    assert not holder.errors, holder.errors
    assert Operation.objects.get(pk=op_a.pk).state == "dispatched"
    assert list(audit_verify()) == []
    chains = {key: _chain(key) for key in ("op-a", "op-b", "op-c")}
    for key, chain in chains.items():
        assert [seq for seq, _ in chain] == list(range(1, len(chain) + 1)), (key, chain)
    kinds_a = [kind for _, kind in chains["op-a"]]
    assert kinds_a.count("test") == 2 and "permit_consumed" in kinds_a, kinds_a
    assert "host_report" in [kind for _, kind in chains["op-b"]]
    slowest = max(steps.timings, key=lambda timing: timing[1])
    print(
        f"B and C while A was held: {elapsed:.1f} s; slowest step {slowest[0]} {slowest[1]:.2f} s"
    )
