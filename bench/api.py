"""Host API throughput, latency and SQL per request over real HTTP, under gunicorn.

    python bench/api.py [--seconds 12] [--clients 1,8,32] [--auto-approve] \\
        [--client library|sockets]

Creates a scratch PostgreSQL database (``bench_api_<name>``, destroyed afterwards;
``DATABASE_URL`` chooses the server, default ``postgres://postgres@127.0.0.1:5432/settle``;
SQLite is refused), configures one SQLite provider, a host and an approver credential,
and runs gunicorn as the README's *Operating and deploying* section does
(``gunicorn settle.wsgi -w 4 -b 127.0.0.1:<free port>``). For each ``--clients`` value it
starts that many client processes (``harness/fleet``, role ``lifecycle``), each
looping register and open the approval (one request) → approve → dispatch → report
committed with unique keys for ``--seconds``; any non-2xx answer is an error. With
``--auto-approve`` a policy of twenty rules approves each opening from a budget, and the
registration dispatches too: register, open and dispatch (one request) → report.
The clients make their requests through ``settle-client`` (``--client library``, the
default: what a host runs) or on plain sockets (``--client sockets``, fleet role
``lifecycle-sockets``: as cheap as a hand-written client, which is what
``bench/api_pairs.py`` gives the new side so that both sides' clients cost alike).
The SQL pass always goes through the library (it reads the counting server's headers).

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
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/settle")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from approvals.services.approvers import approver_create  # noqa: E402
from bench.api_postgres import (  # noqa: E402
    analyze,
    pgbench_inserts,
    scratch_database,
    server_setting,
)
from bench.api_report import print_report  # noqa: E402
from bench.api_runs import (  # noqa: E402
    SQL_PASS_SECONDS,
    WARM_UP_SECONDS,
    Run,
    fleet,
    request_floor,
)
from bench.policies import twenty_rules  # noqa: E402
from common.actors import COMMAND_LINE  # noqa: E402
from harness.gunicorn import (  # noqa: E402
    database_url,
    gunicorn_running,
    pg_deadlocks,
    pg_wait_for_other_sessions,
)
from harness.providers import sqlite_provider_init  # noqa: E402
from policies.services import policy_apply  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402

# The fleet role of each --client: the library's lifecycle, or the same on plain sockets.
ROLES = {"library": "lifecycle", "sockets": "lifecycle-sockets"}


def run(args: argparse.Namespace, settings: dict[str, Any], scratch: Path) -> None:
    provider_path = scratch / "orders.sqlite3"
    sqlite_provider_init(provider_path)
    provider_configure(name="bench", adapter="sqlite", path=str(provider_path), lease_seconds=60)
    _, host_token = host_create(name="bench-host")
    _, approver_token = approver_create(name="bench-approver", all_providers=True)
    if args.auto_approve:
        # Twenty rules, the last approving every lifecycle's opening from its budget.
        policy_apply(source=twenty_rules(paying_action="payment.send"), actor=COMMAND_LINE)
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
    role = ROLES[args.client]
    with gunicorn_running(
        log_path=scratch / "gunicorn.log", threads=args.threads, **server_options
    ) as server:
        fleet(server, tokens, provider, 1, WARM_UP_SECONDS, "warm-up", scratch)
        for count in args.clients:
            analyze()
            print(f"{count} client(s) for {args.seconds:g} s …", flush=True)
            runs.append(
                fleet(server, tokens, provider, count, args.seconds, f"c{count}", scratch, role)
            )
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
        "--auto-approve",
        action="store_true",
        help="apply a policy of twenty rules whose budget approves every opening: the "
        "lifecycle is then register, open (approved) and dispatch in one request, report",
    )
    parser.add_argument(
        "--client",
        choices=sorted(ROLES),
        default="library",
        help="how the clients make their requests: through settle-client (library) or on "
        "plain sockets (sockets, as cheap as a hand-written client)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="gunicorn's --threads for the measured runs (1: sync workers, as deploying.md)",
    )
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
