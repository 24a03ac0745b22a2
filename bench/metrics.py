"""How long one /metrics scrape takes at a million operations (``manage.py benchmark_metrics``).

    python manage.py benchmark_metrics [--operations 1000000] [--providers 4] [--scrapes 50]

Figures, not a test. Everything happens in a scratch database (PostgreSQL: the
``DATABASE_URL`` database's name + ``_benchmet``, dropped and created afresh; SQLite: a
file in a scratch directory). The operations are inserted by one SQL statement, spread
over the providers and states as a long-running deployment's are (almost all terminal:
0.2 % unknown, 0.1 % reconcile, 0.2 % dispatched, 0.1 % awaiting approval, 0.1 %
approved); then beat's snapshot of the terminal states is taken once and the tables are
vacuumed and analyzed (autovacuum's job on a running database). Each scrape is the view
itself, through Django's test client with the bearer token: the health facts and every
process's counters in the metrics directory. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import OutputWrapper
from django.db import connection, connections
from django.test import Client

from bench.scratch import scratch_database_use
from bench.sqlcount import statements_noted
from common.actors import Actor
from monitoring.metrics import metrics_dir
from monitoring.services.pulses import operation_counts_refresh
from recovery.metrics import LOOKUPS
from recovery.models import Host
from recovery.services.providers import provider_configure

BENCH = Actor.system("benchmark")
TOKEN = "benchmark-metrics-token-0123456789"

# n % 1000 → state: the mix of a deployment that has run for a long time.
_STATES = """CASE
    WHEN n % 1000 < 2 THEN 'unknown'
    WHEN n % 1000 < 3 THEN 'reconcile'
    WHEN n % 1000 < 5 THEN 'dispatched'
    WHEN n % 1000 < 6 THEN 'awaiting_approval'
    WHEN n % 1000 < 7 THEN 'approved'
    WHEN n % 1000 < 20 THEN 'failed'
    WHEN n % 1000 < 25 THEN 'expired'
    ELSE 'released' END"""


class MetricsBenchmark:
    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout

    def run(self, **options: Any) -> None:
        count, providers, scrapes = options["operations"], options["providers"], options["scrapes"]
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchmet-"))
        try:
            self._scratch_database(scratch)
            started = time.perf_counter()
            self._operations(count, providers)
            self.stdout.write(
                f"{count:,} operations over {providers} providers inserted in "
                f"{time.perf_counter() - started:.1f} s"
            )
            started = time.perf_counter()
            operation_counts_refresh()
            self.stdout.write(
                f"beat's snapshot of the counts: {time.perf_counter() - started:.2f} s"
            )
            self._vacuum()
            figures = self._scrapes(scrapes)
        finally:
            connections.close_all()
            shutil.rmtree(scratch, ignore_errors=True)
        figures.update(
            operations=count, providers=providers, database=connection.vendor, scrapes=scrapes
        )
        self.stdout.write(
            f"/metrics at {count:,} operations ({connection.vendor}): p50 {figures['p50_ms']} ms, "
            f"p95 {figures['p95_ms']} ms, max {figures['max_ms']} ms, "
            f"{figures['statements']} SQL statements, {figures['bytes']:,} bytes per scrape"
        )
        self.stdout.write(json.dumps(figures))

    def _scratch_database(self, scratch: Path) -> None:
        scratch_database_use(scratch, "_benchmet")

    def _operations(self, count: int, providers: int) -> None:
        host = Host.objects.create(name="bench-fleet", token_hash="sha256:" + uuid.uuid4().hex)
        ids = []
        for number in range(providers):
            provider, _ = provider_configure(
                name=f"bench-{number}", adapter="journal", path="/nonexistent.jsonl", actor=BENCH
            )
            ids.append(provider.pk)
        if connection.vendor == "postgresql":
            numbers = f"generate_series(0, {count - 1}) AS n"
            provider_of = f"(ARRAY{ids})[1 + n % {providers}]"
            due = "now() - make_interval(secs => n % 600)"
        else:
            numbers = (
                f"(WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s "
                f"WHERE n < {count - 1}) SELECT n FROM s)"
            )
            provider_of = f"json_extract('{json.dumps(ids)}', '$[' || (n % {providers}) || ']')"
            due = "datetime('now', '-' || (n % 600) || ' seconds')"
        with connection.cursor() as cursor:
            cursor.execute(
                f"""INSERT INTO recovery_operation (key, host_id, action, provider_id,
                    params_canonical, params_digest, state, version, recovered,
                    lookups_inconclusive, next_lookup_at, audit_seq, audit_hash,
                    receipt_running, created_at, updated_at)
                SELECT 'bench-' || n, {host.pk}, 'payment.send', {provider_of},
                    '{{"amount":1}}', 'sha256:' || n, {_STATES}, 3, false, 0,
                    CASE WHEN n % 1000 < 2 THEN {due} END, 0, '',
                    false, {due}, {due}
                FROM {numbers}"""
            )
        # Counters as a few processes would have left them: one series per provider
        # and verdict in this process's files.
        for number in range(providers):
            for verdict in ("match", "mismatch", "corrupt", "absent", "unavailable"):
                LOOKUPS.labels(provider=f"bench-{number}", verdict=verdict).inc()

    def _vacuum(self) -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
        else:
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")

    def _scrapes(self, scrapes: int) -> dict[str, Any]:
        settings.SETTLE_METRICS_TOKEN = TOKEN
        settings.ALLOWED_HOSTS = ["testserver"]
        client = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        for _ in range(3):  # warm: connection, prepared statements, caches
            assert client.get("/metrics").status_code == 200
        timings = []
        with statements_noted() as statements:
            response = client.get("/metrics")
        for _ in range(scrapes):
            started = time.perf_counter()
            response = client.get("/metrics")
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        timings.sort()
        files = len(list(metrics_dir().glob("*.db")))
        return {
            "p50_ms": round(statistics.median(timings), 1),
            "p95_ms": round(timings[int(0.95 * (len(timings) - 1))], 1),
            "max_ms": round(timings[-1], 1),
            "statements": len(statements),
            "bytes": len(response.content),
            "metrics_files": files,
            "cpus": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 1),
        }
