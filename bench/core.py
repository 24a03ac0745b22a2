"""Latency and SQL statements per step of the recovery core, on a scratch database.

    python bench/core.py [--operations 500]

Runs in-process against a freshly created database (``bench_<name>``, destroyed after),
so it never touches real data; ``DATABASE_URL`` chooses the server. Each step is one
service call, i.e. what one host API request costs below the HTTP layer, except the
background lookup, which is what a Celery worker runs (here in this process). The
lookups resume queues are published to a queue of the benchmark's own on
``CELERY_BROKER_URL``, deleted at the end. The figures go in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")
# Resume publishes the lookups it queues: to a queue no worker of a real deployment reads.
BENCH_QUEUE = "settle-bench-core"
os.environ["SETTLE_CELERY_QUEUE"] = BENCH_QUEUE

import django  # noqa: E402

django.setup()

from celery import current_app  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from common.actors import Actor  # noqa: E402
from harness.providers import sqlite_provider_commit, sqlite_provider_init  # noqa: E402
from recovery.models import Dispatch, Host, LookupAttempt, Operation  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.dispatch import operation_dispatch, operation_report  # noqa: E402
from recovery.services.lookup_tasks import lookup_attempt_run  # noqa: E402
from recovery.services.permits import approval_decision, approval_open  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402
from recovery.services.registration import operation_register  # noqa: E402
from recovery.services.resume import operation_resume  # noqa: E402

BENCH = Actor.system("bench")

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "memo": "benchmark"}
T = TypeVar("T")


class Meter:
    """Wall time and SQL statements of each named step."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.statements: dict[str, list[int]] = defaultdict(list)

    def __call__(self, name: str, call: Callable[[], T]) -> T:
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            result = call()
            self.seconds[name].append(time.perf_counter() - started)
        self.statements[name].append(len(queries.captured_queries))
        return result

    def report(self) -> None:
        print(f"{'step':<34} {'p50 ms':>8} {'p95 ms':>8} {'SQL':>5}")
        for name, samples in self.seconds.items():
            ordered = sorted(samples)
            p50 = statistics.median(ordered) * 1000
            p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000
            sql = statistics.mean(self.statements[name])
            print(f"{name:<34} {p50:>8.2f} {p95:>8.2f} {sql:>5.0f}")


def _approved(meter: Meter, host: Host, key: str) -> Operation:
    operation, _ = meter(
        "register",
        lambda: operation_register(
            host=host, key=key, action="payment.send", provider_name="bench", params=PARAMS
        ),
    )
    approval, _ = meter("open approval", lambda: approval_open(operation=operation, host=host))
    meter(
        "approve (issue permit)",
        lambda: approval_decision(
            approval_id=approval.id,
            approve=True,
            ttl_seconds=300,
            decided_by=BENCH,
            reviewed_digest=operation.params_digest,
        ),
    )
    operation.refresh_from_db()
    return operation


def _dispatch(meter: Meter, operation: Operation) -> Dispatch:
    outcome = meter(
        "dispatch (consume permit)",
        lambda: operation_dispatch(
            operation=operation,
            worker="w",
            presented_digest=operation.params_digest,
            actor=BENCH,
        ),
    )
    assert outcome.dispatch is not None
    return outcome.dispatch


def run(count: int, scratch: Path) -> None:
    provider_db = scratch / "orders.sqlite3"
    sqlite_provider_init(provider_db)
    provider_configure(name="bench", adapter="sqlite", path=str(provider_db), lease_seconds=60)
    host, _ = host_create(name="bench-host")
    meter = Meter()
    print(f"database: {connection.vendor}; {count} operations per path; {timezone.now():%F}")

    started = time.perf_counter()
    for i in range(count):
        operation = _approved(meter, host, f"happy-{i}")
        token = _dispatch(meter, operation).fencing_token
        meter(
            "report committed",
            lambda op=operation, token=token: operation_report(
                operation=op,
                fencing_token=token,
                outcome="committed",
                provider_reference="ref",
                actor=BENCH,
            ),
        )
    happy = count / (time.perf_counter() - started)

    started = time.perf_counter()
    for i in range(count):
        key = f"crash-{i}"
        operation = _approved(meter, host, key)
        _dispatch(meter, operation)
        sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference="ref")
        Dispatch.objects.filter(operation=operation).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        operation.refresh_from_db()
        answer = meter(
            "resume after crash (lookup queued)",
            lambda op=operation: operation_resume(operation=op, worker="fresh", actor=BENCH),
        )
        assert answer.decision == "in_progress", answer
        attempt = LookupAttempt.objects.get(operation=operation)
        meter(
            "background lookup (Celery's task)",
            lambda attempt=attempt: lookup_attempt_run(attempt_id=attempt.pk),
        )
        answer = meter(
            "resume (released)",
            lambda op=operation: operation_resume(operation=op, worker="fresh", actor=BENCH),
        )
        assert answer.decision == "released", answer
    recovered = count / (time.perf_counter() - started)

    meter.report()
    print(f"whole lifecycle, one thread: {happy:.0f} operations/s reported by the worker, ")
    print(f"  {recovered:.0f} operations/s recovered from evidence after a crash (resume,")
    print("  the background lookup, resume again)")
    _statement_cpu(host)


def _statement_cpu(host: Host, rounds: int = 2000) -> None:
    """What one statement costs this process in CPU: through the ORM, and as a raw cursor.

    The explanation of what bounds the API's throughput (see docs/benchmarks.md), measured.
    """
    token_hash = host.token_hash

    def orm() -> None:
        Host.objects.filter(token_hash=token_hash).first()

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, name FROM recovery_host WHERE token_hash = %s", [token_hash])
            cursor.fetchone()

    for name, call in (("ORM filter().first()", orm), ("raw cursor", raw)):
        call()
        started = time.process_time()
        for _ in range(rounds):
            call()
        cpu = (time.process_time() - started) / rounds * 1e6
        print(f"one-row SELECT, CPU of this process: {name:<22} {cpu:6.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=500)
    count = parser.parse_args().operations
    settings: dict[str, Any] = connection.settings_dict
    engine = str(settings["ENGINE"])
    scratch_db = (
        str(Path(str(settings["NAME"])).with_name("bench_settle.sqlite3"))
        if engine.endswith("sqlite3")
        else f"bench_{settings['NAME']}"
    )
    settings["TEST"] = {**settings.get("TEST", {}), "NAME": scratch_db}
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            run(count, Path(scratch))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        with current_app.connection_for_write() as broker:
            broker.default_channel.queue_delete(BENCH_QUEUE)


if __name__ == "__main__":
    main()
