"""A batch of transitions: the same table and compare-and-set per row, few statements."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from audit.chain import audit_chain_locked, audit_transaction
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from bench.sqlcount import StatementCount, counting
from common.actors import Actor
from harness.providers import sqlite_provider_commit
from recovery.models import Dispatch, Operation, State
from recovery.services.lookup_tasks import lookup_batch_run
from recovery.services.sweep import leases_sweep, sweep
from recovery.transitions import Change, Event, operation_transition_many
from tests.support.flow import PARAMS

SYSTEM = Actor.system("test")


def _crashed(flow: Any, keys: list[str]) -> None:
    for key in keys:
        flow.approved(key)
        assert flow.dispatch(key).status_code == 200
    Dispatch.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _elsewhere(work: Callable[[], object]) -> None:
    """Run ``work`` in a database session of its own, committed before this returns."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def _lease_lost(operation: Operation) -> Change:
    return Change(operation, Event.LEASE_LOST, {"reason": "test"}, {"next_lookup_at": None})


@pytest.mark.django_db(transaction=True)
def test_a_row_changed_after_the_batch_read_it_is_refused_alone_and_the_others_move(
    flow: Any,
) -> None:
    keys = ["op-1", "op-2", "op-3"]
    _crashed(flow, keys)
    read = list(Operation.objects.filter(key__in=keys).order_by("key"))
    # Another session moves op-2 on between the batch's read and its update.
    _elsewhere(lambda: Operation.objects.filter(key="op-2").update(version=F("version") + 1))

    with audit_transaction():
        refused = operation_transition_many(
            changes=[_lease_lost(audit_chain_locked(operation)) for operation in read],
            actor=SYSTEM,
        )

    assert [(r.operation_key, r.reason) for r in refused] == [("op-2", "stale (state, version)")]
    rows = {op.key: (op.state, op.version) for op in Operation.objects.all()}
    assert rows == {"op-1": ("unknown", 4), "op-2": ("dispatched", 4), "op-3": ("unknown", 4)}
    assert [op.state for op in read] == ["unknown", "dispatched", "unknown"]  # as the rows
    lost = AuditEvent.objects.filter(kind="transition", data__event="lease_lost")
    assert sorted(lost.values_list("operation_key", flat=True)) == ["op-1", "op-3"]
    assert list(audit_verify()) == []  # op-2's retracted event left no gap in its chain


@pytest.mark.django_db
def test_a_batch_refuses_what_the_table_forbids_and_moves_the_rest(flow: Any) -> None:
    _crashed(flow, ["op-1", "op-2"])
    first, second = Operation.objects.order_by("key")
    with audit_transaction():
        refused = operation_transition_many(
            changes=[
                _lease_lost(audit_chain_locked(first)),
                Change(audit_chain_locked(second), Event.APPROVE),
            ],
            actor=SYSTEM,
        )
    assert [(r.operation_key, r.reason) for r in refused] == [
        ("op-2", "not allowed from this state")
    ]
    assert dict(Operation.objects.values_list("key", "state")) == {
        "op-1": State.UNKNOWN,
        "op-2": State.DISPATCHED,
    }
    assert list(audit_verify()) == []


def _statements(work: Callable[[], object]) -> int:
    count = StatementCount()
    stop = counting(count)
    try:
        work()
    finally:
        stop()
    return count.total


@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite writes a batch row by row (one writer)"
)
def test_statements_per_batch_do_not_grow_with_the_batch_size(flow: Any, provider_db: Path) -> None:
    """Lapsed leases, queued lookups and applied answers: the same statements for 3 or 30."""
    figures = []
    for size in (3, 30):
        keys = [f"op-{size}-{n}" for n in range(size)]
        _crashed(flow, keys)
        for key in keys:
            sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference=key)
        lapsed = _statements(lambda: leases_sweep(batch_size=100))
        published: list[list[int]] = []
        queued = _statements(lambda published=published: sweep(publish_batch=published.append))
        [batch] = published
        applied = _statements(lambda batch=batch: lookup_batch_run(attempt_ids=batch))
        assert len(batch) == size
        assert set(Operation.objects.filter(key__in=keys).values_list("state", flat=True)) == {
            State.RELEASED
        }
        figures.append((lapsed, queued, applied))
    print(f"\nstatements (lapse, queue, apply) for 3 and for 30: {figures}")
    assert figures[0] == figures[1]
    assert list(audit_verify()) == []
