"""Throughput and SQL statements per operation for the recovery core, on a scratch database.

    python bench/core.py [--operations 500]

Runs in-process against a freshly created database (``bench_<name>``, destroyed after), so
it never touches real data; ``DATABASE_URL`` chooses the server. Figures go in the README.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from approvals.services import approver_create  # noqa: E402
from recovery.models import Dispatch, Operation  # noqa: E402
from recovery.services import (  # noqa: E402
    approval_decision,
    approval_open,
    host_create,
    operation_dispatch,
    operation_register,
    operation_report,
    operation_resume,
    provider_configure,
)
from tests.support.providers import sqlite_provider_commit, sqlite_provider_init  # noqa: E402

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "memo": "benchmark"}


class Bench:
    def handle(self, operations: int) -> None:
        settings = connection.settings_dict
        settings.setdefault("TEST", {})
        settings["TEST"] = {**settings["TEST"], "NAME": _scratch_name(settings)}
        creation = connection.creation
        old_name = creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
        try:
            with tempfile.TemporaryDirectory() as scratch:
                self._run(operations, Path(scratch))
        finally:
            creation.destroy_test_db(old_name, verbosity=0)

    def _run(self, count: int, scratch: Path) -> None:
        provider_db = scratch / "orders.sqlite3"
        sqlite_provider_init(provider_db)
        provider_configure(name="bench", adapter="sqlite", path=str(provider_db), lease_seconds=60)
        host, _ = host_create(name="bench-host")
        approver_create(name="bench-approver")
        print(
            f"database: {connection.vendor}, {count} operations per path, {timezone.now():%Y-%m-%d}"
        )

        def happy(i: int) -> None:
            operation = self._approved(host, f"happy-{i}")
            outcome = operation_dispatch(
                operation=operation,
                worker="w",
                presented_digest=operation.params_digest,
                actor="bench",
            )
            assert outcome.dispatch is not None
            operation_report(
                operation=operation,
                fencing_token=outcome.dispatch.fencing_token,
                outcome="committed",
                provider_reference=f"ref-{i}",
                actor="bench",
            )

        def recovered(i: int) -> None:
            key = f"crash-{i}"
            operation = self._approved(host, key)
            operation_dispatch(
                operation=operation,
                worker="w",
                presented_digest=operation.params_digest,
                actor="bench",
            )
            sqlite_provider_commit(
                provider_db, operation_key=key, params=PARAMS, reference=f"ref-{i}"
            )
            Dispatch.objects.filter(operation=operation).update(
                lease_expires_at=timezone.now() - timedelta(seconds=1)
            )
            operation.refresh_from_db()
            answer = operation_resume(operation=operation, worker="fresh", actor="bench")
            assert answer.decision == "released", answer

        self._measure("register → approve → dispatch → report", happy, count)
        self._measure("… → dispatch → crash → resume (lookup, release)", recovered, count)

    def _approved(self, host: Any, key: str) -> Operation:
        operation, _ = operation_register(
            host=host, key=key, action="payment.send", provider_name="bench", params=PARAMS
        )
        approval, _ = approval_open(operation=operation, host=host)
        approval_decision(
            approval_id=approval.id, approve=True, ttl_seconds=300, decided_by="bench"
        )
        operation.refresh_from_db()
        return operation

    def _measure(self, name: str, step: Callable[[int], None], count: int) -> None:
        durations: list[float] = []
        statements: list[int] = []
        started = time.perf_counter()
        for i in range(count):
            connection.queries_log.clear()
            with CaptureQueriesContext(connection) as queries:
                t0 = time.perf_counter()
                step(i)
                durations.append(time.perf_counter() - t0)
            statements.append(len(queries.captured_queries))
        elapsed = time.perf_counter() - started
        durations.sort()
        p50 = statistics.median(durations) * 1000
        p95 = durations[int(len(durations) * 0.95) - 1] * 1000
        print(
            f"{name}: {count / elapsed:.0f} ops/s, p50 {p50:.2f} ms, p95 {p95:.2f} ms, "
            f"{statistics.mean(statements):.0f} SQL statements per operation"
        )


def _scratch_name(settings: dict[str, Any]) -> str:
    if str(settings["ENGINE"]).endswith("sqlite3"):
        return str(Path(str(settings["NAME"])).with_name("bench_settle.sqlite3"))
    return f"bench_{settings['NAME']}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=500)
    Bench().handle(parser.parse_args().operations)
