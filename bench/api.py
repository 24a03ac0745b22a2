"""Host API throughput, latency and SQL per request over real HTTP, under gunicorn.

    python bench/api.py [--seconds 12] [--clients 1,8,32]

Creates a scratch PostgreSQL database (``bench_api_<name>``, destroyed afterwards;
``DATABASE_URL`` chooses the server, default ``postgres://postgres@127.0.0.1:5432/settle``;
SQLite is refused), configures one SQLite provider, a host and an approver credential,
and runs gunicorn as the README's *Operating and deploying* section does
(``gunicorn console.wsgi -w 4 -b 127.0.0.1:<free port>``). For each ``--clients`` value it
starts that many client processes (``tests/procs/fleet.py``, role ``lifecycle``), each
looping register → open approval → approve → dispatch → report committed with unique
keys for ``--seconds``; any non-2xx answer is an error.

It also measures, on the same server and database:

* the SQL statements of each request, in a short separate pass (one client) through
  ``gunicorn bench.counting_wsgi`` — what is counted is in that module's docstring
  (statements plus BEGIN and COMMIT/ROLLBACK of every transaction);
* the commit rate of ``pgbench -n -c 1 -T 5`` with a script inserting one row into a
  one-column table per transaction: the floor a single client's commits sit on;
* what an unauthenticated request (401, no SQL) costs gunicorn's workers: the floor
  that gunicorn and Django put under every request;
* the deadlocks PostgreSQL counted in the scratch database during the whole run;
* per run, the CPU time of gunicorn's workers and of the database's PostgreSQL backends
  (from ``/proc``, so Linux only) and of the client processes in their loops (each
  measures its own) per request, and how busy the whole machine was: on a small shared
  machine the API is usually CPU-bound long before it is commit-bound, and the clients
  share that CPU.

Prints two Markdown tables to paste into docs/benchmarks.md. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/settle")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from approvals.services import approver_create  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402
from tests.procs.fleet import FleetSpec, fleet_run  # noqa: E402
from tests.support.gunicorn import (  # noqa: E402
    GunicornServer,
    database_url,
    gunicorn_running,
    pg_deadlocks,
    pg_wait_for_other_sessions,
)
from tests.support.providers import sqlite_provider_init  # noqa: E402

ENDPOINTS = ("register", "open approval", "approve", "dispatch", "report committed")
SQL_PASS_SECONDS = 3.0
WARM_UP_SECONDS = 1.5
PGBENCH_SECONDS = 5


# -- the scratch database -----------------------------------------------------------------


@contextlib.contextmanager
def scratch_database() -> Iterator[dict[str, Any]]:
    """Create ``bench_api_<NAME>`` on the configured server, switch to it, drop it afterwards."""
    settings: dict[str, Any] = connection.settings_dict
    settings["TEST"] = {**settings.get("TEST", {}), "NAME": f"bench_api_{settings['NAME']}"}
    original_name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, serialize=False
    )
    try:
        yield settings
    finally:
        with contextlib.suppress(Exception):
            pg_wait_for_other_sessions(connection)
        connection.close()
        connection.creation.destroy_test_db(original_name, verbosity=0)


def analyze() -> None:
    """Bring the planner's statistics up to date, as autovacuum does between runs.

    The statements are prepared (``SETTLE_DB_PREPARED_STATEMENTS``) and keep the plan
    made when the scratch tables were nearly empty until an ANALYZE replaces it. A
    server with autovacuum on (PostgreSQL's default) does this by itself as tables
    grow; one with it off (this project's test machine) never does.
    """
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def server_setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


# -- pgbench --------------------------------------------------------------------------------


def pgbench_inserts(settings: dict[str, Any], scratch: Path) -> dict[str, float]:
    """``pgbench -n -c 1 -T 5``, one single-row INSERT per transaction; rate and latency."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_pgbench_insert (v integer)")
    script = scratch / "insert.sql"
    script.write_text("INSERT INTO bench_pgbench_insert (v) VALUES (1);\n", "utf-8")
    log_prefix = scratch / "pgbench_log"
    command = [
        "pgbench",
        "-n",
        "-c",
        "1",
        "-T",
        str(PGBENCH_SECONDS),
        "-f",
        str(script),
        "-l",
        f"--log-prefix={log_prefix}",
        "-h",
        str(settings.get("HOST") or "127.0.0.1"),
        "-p",
        str(settings.get("PORT") or 5432),
        "-U",
        str(settings.get("USER") or "postgres"),
        str(settings["NAME"]),
    ]
    env = {**os.environ}
    if settings.get("PASSWORD"):
        env["PGPASSWORD"] = str(settings["PASSWORD"])
    done = subprocess.run(
        command,
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=PGBENCH_SECONDS + 60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed: {done.stderr or done.stdout}")
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    if match is None:
        raise RuntimeError(f"cannot read pgbench's output:\n{done.stdout}")
    latencies = [
        int(line.split()[2]) / 1000
        for path in scratch.glob("pgbench_log*")
        for line in path.read_text("utf-8").splitlines()
        if line.strip()
    ]
    return {
        "tps": float(match.group(1)),
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
    }


# -- running the fleet and reading what it measured ---------------------------------------


def process_cpu(pids: set[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process in ``pids`` used so far (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def server_pids(master: int) -> tuple[set[int], set[int]]:
    """gunicorn's workers (children of ``master``) and the scratch database's backends."""
    workers = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text("ascii", "replace").rpartition(")")[2].split()[1]) == master:
                workers.add(int(stat.parent.name))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        backends = {int(row[0]) for row in cursor.fetchall()}
    return workers, backends


class CpuMeter:
    """CPU used by gunicorn's workers and by PostgreSQL's backends during one run."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.workers, self.backends = server_pids(master)
        self.before = process_cpu(self.workers | self.backends)

    def used(self) -> tuple[float, float]:
        """``(gunicorn seconds, PostgreSQL seconds)`` since this meter was made."""
        workers, backends = server_pids(self.master)
        workers |= self.workers
        backends |= self.backends
        now = process_cpu(workers | backends)

        def spent(pids: set[int]) -> float:
            return sum(now[pid] - self.before.get(pid, 0.0) for pid in pids if pid in now)

        return spent(workers), spent(backends)


def machine_cpu() -> tuple[int, int]:
    """``(busy, total)`` jiffies of the whole machine so far, from /proc/stat (Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(n) for n in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Run:
    """What one fleet run measured: calls, lifecycles, wall time, errors."""

    def __init__(self, clients: int, results: list[dict[str, Any]]) -> None:
        self.clients = clients
        self.failed = [r for r in results if "error" in r]
        finished = [r for r in results if "error" not in r]
        self.calls = [call for r in finished for call in r["calls"]]
        self.lifecycles = sum(int(r["lifecycles"]) for r in finished)
        self.seconds = (
            max(r["finished"] for r in finished) - min(r["started"] for r in finished)
            if finished
            else math.nan
        )
        self.cpu = (math.nan, math.nan)  # CPU seconds of gunicorn's workers, of PostgreSQL
        # CPU seconds the client processes themselves spent in their loops.
        self.client_cpu = sum(float(r.get("cpu", math.nan)) for r in finished)
        self.machine_busy = math.nan  # share of the machine's CPU time that was busy
        self.machine_seconds = math.nan  # busy CPU seconds of the whole machine
        self.errors = Counter(
            f"{status} {code}" for _, status, code, *_ in self.calls if not 200 <= status < 300
        )

    def rest_cpu(self) -> float:
        """Busy CPU seconds of the machine outside the workers, backends and clients.

        The kernel's network work, gunicorn's master, this script, anything else.
        """
        return self.machine_seconds - self.cpu[0] - self.cpu[1] - self.client_cpu

    def latencies(self, endpoint: str | None = None) -> list[float]:
        return [c[3] for c in self.calls if endpoint is None or c[0] == endpoint]

    def sql(self, endpoint: str) -> tuple[float, float, int]:
        """Median statements, median transactions and the maximum statements seen."""
        rows = [(c[4], c[5]) for c in self.calls if c[0] == endpoint and c[4] is not None]
        if not rows:
            return math.nan, math.nan, 0
        return (
            statistics.median(r[0] for r in rows),
            statistics.median(r[1] for r in rows),
            max(r[0] for r in rows),
        )


def fleet(
    server: GunicornServer,
    tokens: tuple[str, str],
    provider: dict[str, Any],
    count: int,
    seconds: float,
    tag: str,
    scratch: Path,
) -> Run:
    specs = [FleetSpec(f"{tag}-{i}", "lifecycle", [provider]) for i in range(count)]
    meters: list[Any] = []

    def start_meters() -> None:  # once the clients have started up, as they are released
        meters[:] = [CpuMeter(server.process.pid), machine_cpu()]

    results = fleet_run(
        url=server.url,
        host_token=tokens[0],
        approver_token=tokens[1],
        clients=specs,
        seconds=seconds,
        directory=scratch / tag,
        on_go=start_meters,
    )
    meter, (busy_before, total_before) = meters
    run = Run(count, results)
    busy, total = machine_cpu()
    run.cpu = meter.used()
    if total > total_before:
        run.machine_busy = (busy - busy_before) / (total - total_before)
        run.machine_seconds = (busy - busy_before) / os.sysconf("SC_CLK_TCK")
    return run


# -- the report -----------------------------------------------------------------------------


FLOOR_REQUESTS = 2000


def request_floor(server: GunicornServer) -> tuple[float, float]:
    """What a request costs gunicorn and Django with no work behind it.

    ``FLOOR_REQUESTS`` unauthenticated API requests (401 before any SQL), each on a
    connection of its own as the fleet's are, from 4 threads: ``(gunicorn CPU ms per
    request, requests per second)``. What a lifecycle's request costs beyond this is
    the services' own work.
    """
    meter = CpuMeter(server.process.pid)
    host, port = "127.0.0.1", server.port

    def send(count: int) -> None:
        for _ in range(count):
            connection = http.client.HTTPConnection(host, port, timeout=10)
            try:
                connection.request("GET", "/api/v1/operations/floor")
                connection.getresponse().read()
            finally:
                connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=send, args=(FLOOR_REQUESTS // 4,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    gunicorn_seconds, _ = meter.used()
    return gunicorn_seconds / FLOOR_REQUESTS * 1000, FLOOR_REQUESTS / elapsed


def ms(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def print_report(
    args: argparse.Namespace,
    runs: list[Run],
    sql: Run,
    pgbench: dict[str, float],
    facts: dict[str, Any],
) -> None:
    print()
    print(
        f"Host API over HTTP, gunicorn console.wsgi -w 4, PostgreSQL {facts['server_version']} "
        f"(synchronous_commit={facts['synchronous_commit']}, "
        f"autovacuum={facts['autovacuum']}: ANALYZE before each run), {facts['cpus']} CPUs, "
        f"{time.strftime('%Y-%m-%d')}; {args.seconds:g} s per run, one client process per "
        "client, unique keys, no provider effect; latency per request, errors included."
    )
    print()
    print(
        "| run | throughput | p50 ms | p99 ms | errors "
        "| CPU ms per request: gunicorn / PostgreSQL / clients / rest | machine CPU busy |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| pgbench, 1 client, one single-row INSERT per transaction | "
        f"{pgbench['tps']:.0f} commits/s | {ms(pgbench['p50'])} | {ms(pgbench['p99'])} | 0 | | |"
    )
    for run in runs:
        rate = run.lifecycles / run.seconds if run.seconds else math.nan
        requests = len(run.calls) / run.seconds if run.seconds else math.nan
        errors = ", ".join(f"{code}: {n}" for code, n in run.errors.most_common()) or "0"
        if run.failed:
            errors += f"; {len(run.failed)} client(s) wrote no result"
        all_latency = run.latencies()
        print(
            f"| API, {run.clients} client{'s' if run.clients > 1 else ''} | "
            f"{rate:.1f} lifecycles/s ({requests:.0f} requests/s) | "
            f"{ms(percentile(all_latency, 0.5))} | {ms(percentile(all_latency, 0.99))} | "
            f"{errors} | {ms(run.cpu[0] * 1000 / len(run.calls) if run.calls else math.nan, 2)} / "
            f"{ms(run.cpu[1] * 1000 / len(run.calls) if run.calls else math.nan, 2)} / "
            f"{ms(run.client_cpu * 1000 / len(run.calls) if run.calls else math.nan, 2)} / "
            f"{ms(run.rest_cpu() * 1000 / len(run.calls) if run.calls else math.nan, 2)} | "
            f"{run.machine_busy:.0%} |"
        )
    print()
    header = " | ".join(f"p50 / p99 ms, {run.clients} cl." for run in runs)
    print(f"| endpoint | SQL / request | transactions | {header} |")
    print("| --- | --- | --- |" + " --- |" * len(runs))
    totals = [0.0, 0.0]
    for endpoint in ENDPOINTS:
        statements, transactions, highest = sql.sql(endpoint)
        totals[0] += statements
        totals[1] += transactions
        spread = f" (max {highest})" if highest > statements else ""
        cells = " | ".join(
            f"{ms(percentile(run.latencies(endpoint), 0.5))} / "
            f"{ms(percentile(run.latencies(endpoint), 0.99))}"
            for run in runs
        )
        print(f"| {endpoint} | {statements:g}{spread} | {transactions:g} | {cells} |")
    print(f"| whole lifecycle | {totals[0]:g} | {totals[1]:g} |" + " |" * len(runs))
    print()
    if totals[1]:
        ceiling = pgbench["tps"] / totals[1]
        print(
            f"A lifecycle commits {totals[1]:g} transactions: at pgbench's single-client "
            f"commit rate that caps one client at about {ceiling:.0f} lifecycles/s."
        )
    print(
        f"Machine CPU busy counts every process (the clients too, and whatever else runs on "
        f"this shared machine: load average {facts['load']:.1f} at the end)."
    )
    print(
        f"Deadlocks counted by PostgreSQL in the scratch database, whole run: "
        f"{facts['deadlocks']}. SQL pass: {len(sql.calls)} requests, one client, "
        f"{SQL_PASS_SECONDS:g} s through bench/counting_wsgi.py."
    )
    floor_ms, floor_rate = facts["floor"]
    print(
        f"Request floor: an unauthenticated API request (401, no SQL) costs {floor_ms:.2f} ms "
        f"of gunicorn CPU ({floor_rate:.0f} requests/s from 4 threads, a connection each): "
        "gunicorn's and Django's share of every request above."
    )
    if sql.errors or sql.failed:
        print(f"SQL pass errors: {dict(sql.errors)}; clients without result: {len(sql.failed)}")


# -- main -------------------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: dict[str, Any], scratch: Path) -> None:
    provider_path = scratch / "orders.sqlite3"
    sqlite_provider_init(provider_path)
    provider_configure(name="bench", adapter="sqlite", path=str(provider_path), lease_seconds=60)
    _, host_token = host_create(name="bench-host")
    _, approver_token = approver_create(name="bench-approver", all_providers=True)
    tokens = (host_token, approver_token)
    provider = {"kind": "sqlite", "name": "bench", "path": str(provider_path)}
    facts: dict[str, Any] = {
        "server_version": server_setting("server_version").split()[0],
        "synchronous_commit": server_setting("synchronous_commit"),
        "cpus": os.cpu_count(),
        "autovacuum": server_setting("autovacuum"),
    }
    deadlocks_before = pg_deadlocks(connection)
    print(f"{platform.node()}: scratch database {settings['NAME']}; pgbench …", flush=True)
    pgbench = pgbench_inserts(settings, scratch)
    server_options = {
        "database_url": database_url(settings),
        "env": {
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "audit-checkpoints.jsonl"),
            # One token stands for the whole fleet here: a limit per credential would
            # measure itself, not the API.
            "SETTLE_HOST_RATE_PER_SECOND": "0",
        },
    }
    print("SQL pass through bench.counting_wsgi …", flush=True)
    with gunicorn_running(
        app="bench.counting_wsgi", log_path=scratch / "gunicorn-sql.log", **server_options
    ) as server:
        sql = fleet(server, tokens, provider, 1, SQL_PASS_SECONDS, "sql", scratch)
    runs: list[Run] = []
    with gunicorn_running(log_path=scratch / "gunicorn.log", **server_options) as server:
        fleet(server, tokens, provider, 1, WARM_UP_SECONDS, "warm-up", scratch)
        for count in args.clients:
            analyze()
            print(f"{count} client(s) for {args.seconds:g} s …", flush=True)
            runs.append(fleet(server, tokens, provider, count, args.seconds, f"c{count}", scratch))
        print("request floor …", flush=True)
        facts["floor"] = request_floor(server)
    pg_wait_for_other_sessions(connection)
    facts["deadlocks"] = pg_deadlocks(connection) - deadlocks_before
    facts["load"] = os.getloadavg()[0]
    print_report(args, runs, sql, pgbench, facts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="per concurrency level")
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
        default=[1, 8, 32],
        help="comma-separated client process counts",
    )
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit(
            f"bench/api.py measures PostgreSQL, but DATABASE_URL selects {connection.vendor}; "
            "set DATABASE_URL=postgres://user@host:5432/settle (or leave it unset)."
        )
    with scratch_database() as settings, tempfile.TemporaryDirectory() as scratch:
        run(args, settings, Path(scratch))


if __name__ == "__main__":
    main()
