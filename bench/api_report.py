"""The report of ``bench/api.py``: two Markdown tables for docs/benchmarks.md, and the
notes under them.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from bench.api_runs import SQL_PASS_SECONDS, Run, percentile

ENDPOINTS = (
    "register",
    "open approval",
    "register and open",
    "register, open and dispatch",
    "approve",
    "dispatch",
    "report committed",
)


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
        "Host API over HTTP, gunicorn settle.wsgi -w 4"
        + (f" --threads {args.threads}" if args.threads > 1 else "")
        + f", PostgreSQL {facts['server_version']} "
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
    print(f"| endpoint | SQL / request | transactions | CPU ms / request | {header} |")
    print("| --- | --- | --- | --- |" + " --- |" * len(runs))
    totals = [0.0, 0.0, 0.0]
    for endpoint in ENDPOINTS:
        statements, transactions, highest = sql.sql(endpoint)
        if math.isnan(statements):  # not in this lifecycle (approve, when a policy approves)
            continue
        totals[0] += statements
        totals[1] += transactions
        totals[2] += sql.cpu_ms(endpoint)
        spread = f" (max {highest})" if highest > statements else ""
        cells = " | ".join(
            f"{ms(percentile(run.latencies(endpoint), 0.5))} / "
            f"{ms(percentile(run.latencies(endpoint), 0.99))}"
            for run in runs
        )
        cpu = ms(sql.cpu_ms(endpoint), 2)
        print(f"| {endpoint} | {statements:g}{spread} | {transactions:g} | {cpu} | {cells} |")
    print(
        f"| whole lifecycle | {totals[0]:g} | {totals[1]:g} | {ms(totals[2], 2)} |"
        + " |" * len(runs)
    )
    print(
        "CPU ms / request: the gunicorn worker's thread from the request's start until its "
        "answer was decided, median of the SQL pass (one client, bench/counting_wsgi.py)."
    )
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
