"""Lifecycles per second through settle_client against raw HTTP, in one run.

    python bench/client.py [--seconds 10] [--clients 8] [--rounds 2]

On a scratch PostgreSQL database (``bench/api.py``'s: ``bench_api_<name>``, dropped
afterwards), one SQLite provider and ``gunicorn console.wsgi -w 4``, it alternates rounds
of ``--clients`` client processes (``tests/procs/fleet.py``): role ``lifecycle``, the
plain-socket raw-HTTP loop of ``bench/api.py``, and role ``library``, the same five
requests made by ``settle_client.Host.run`` (register, open approval, approve with the
digest, dispatch, report). Alternating meets both with the same server, database and
machine. Prints each round, then the library's rate as a share of raw (the target is at
least 95 %) and each client's own CPU per HTTP request (measured by the client processes
in their loops). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/settle")

import django  # noqa: E402

django.setup()

from approvals.services import approver_create  # noqa: E402
from bench.api import analyze, scratch_database  # noqa: E402
from bench.api import connection as db  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402
from tests.procs.fleet import FleetSpec, fleet_run  # noqa: E402
from tests.support.gunicorn import database_url, gunicorn_running  # noqa: E402
from tests.support.providers import sqlite_provider_init  # noqa: E402

ROLES = ("lifecycle", "library")


def round_of(
    url: str, tokens: tuple[str, str], provider: dict[str, Any], role: str, args: Any, tag: str
) -> dict[str, Any]:
    specs = [FleetSpec(f"{tag}-{i}", role, [provider]) for i in range(args.clients)]
    with tempfile.TemporaryDirectory() as directory:
        results = fleet_run(
            url=url,
            host_token=tokens[0],
            approver_token=tokens[1],
            clients=specs,
            seconds=args.seconds,
            directory=Path(directory),
        )
    failed = [r for r in results if "error" in r]
    if failed:
        raise RuntimeError(f"clients failed: {failed}")
    lifecycles = sum(r["lifecycles"] for r in results)
    requests = sum(r["requests"] if role == "library" else len(r["calls"]) for r in results)
    cpu = sum(r["cpu"] for r in results)
    return {
        "role": role,
        "lifecycles_per_s": lifecycles / args.seconds,
        "requests": requests,
        "client_cpu_ms_per_request": 1000 * cpu / requests if requests else 0.0,
        "unexpected": sum(len(r["unexpected"]) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each role")
    args = parser.parse_args()
    if db.vendor != "postgresql":
        sys.exit("bench/client.py measures PostgreSQL; set DATABASE_URL=postgres://…")
    with scratch_database() as settings, tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        orders = scratch / "orders.sqlite3"
        sqlite_provider_init(orders)
        provider_configure(name="bench", adapter="sqlite", path=str(orders), lease_seconds=60)
        _, host_token = host_create(name="bench-host")
        _, approver_token = approver_create(name="bench-approver", all_providers=True)
        provider = {"kind": "sqlite", "name": "bench", "path": str(orders)}
        tokens = (host_token, approver_token)
        rounds: list[dict[str, Any]] = []
        env = {"SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl")}
        with gunicorn_running(
            database_url=database_url(settings), log_path=scratch / "gunicorn.log", env=env
        ) as server:
            round_of(server.url, tokens, provider, "lifecycle", _warm(args), "warm")
            for n in range(args.rounds):
                for role in ROLES if n % 2 == 0 else reversed(ROLES):
                    analyze()
                    result = round_of(server.url, tokens, provider, role, args, f"{role}{n}")
                    rounds.append(result)
                    print(
                        f"{role:9} {result['lifecycles_per_s']:7.1f} lifecycles/s, "
                        f"client CPU {result['client_cpu_ms_per_request']:.3f} ms/request, "
                        f"unexpected {result['unexpected']}",
                        flush=True,
                    )
    totals = {
        role: sum(r["lifecycles_per_s"] for r in rounds if r["role"] == role) / args.rounds
        for role in ROLES
    }
    cpu = {
        role: sum(r["client_cpu_ms_per_request"] for r in rounds if r["role"] == role) / args.rounds
        for role in ROLES
    }
    share = totals["library"] / totals["lifecycle"] if totals["lifecycle"] else 0.0
    print(
        f"library {totals['library']:.1f}/s = {100 * share:.1f} % of raw "
        f"{totals['lifecycle']:.1f}/s at {args.clients} clients; library CPU "
        f"{cpu['library']:.3f} ms/request (raw client {cpu['lifecycle']:.3f} ms)"
    )
    print(
        json.dumps(
            {
                "clients": args.clients,
                "seconds_per_round": args.seconds,
                "rounds": args.rounds,
                "raw_lifecycles_per_s": round(totals["lifecycle"], 1),
                "library_lifecycles_per_s": round(totals["library"], 1),
                "library_share_of_raw": round(share, 3),
                "library_cpu_ms_per_request": round(cpu["library"], 3),
                "raw_client_cpu_ms_per_request": round(cpu["lifecycle"], 3),
                "unexpected": sum(r["unexpected"] for r in rounds),
            }
        )
    )


def _warm(args: Any) -> Any:
    return argparse.Namespace(seconds=1.5, clients=1)


if __name__ == "__main__":
    main()
