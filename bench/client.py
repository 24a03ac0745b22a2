"""Lifecycles per second through settle_client against raw HTTP, in one run.

    python bench/client.py [--seconds 10] [--clients 8] [--rounds 3]

On a scratch PostgreSQL database (``bench/api.py``'s: ``bench_api_<name>``, dropped
afterwards), one SQLite provider and ``gunicorn settle.wsgi -w 4``, it alternates rounds
of ``--clients`` client processes (``harness/fleet``) in three roles, the same four
requests each (register and open the approval, approve with the digest, dispatch, report):

* ``library``: ``settle_client.Host.run``;
* ``raw httpx`` (fleet role ``httpx``): the same lifecycle written by hand on
  ``httpx.Client``, as a host engineer would without the library; the baseline the
  target (the library at least 95 % of it) is measured against;
* ``raw sockets`` (fleet role ``sockets``): the same lifecycle by hand on plain sockets,
  a fresh connection per request, reported so that what any HTTP client costs here is
  not hidden.

Rotating the order meets all three with the same server, database and machine. Prints
each round, then the library's rate as a share of each raw loop, each role's own client
CPU per HTTP request (measured by the client processes in their loops) and the library's
own CPU per run (its CPU per lifecycle minus raw httpx's). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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

from approvals.services.approvers import approver_create  # noqa: E402
from bench.api_postgres import analyze, scratch_database  # noqa: E402
from bench.api_postgres import connection as db  # noqa: E402
from harness.fleet.run import FleetSpec, fleet_run  # noqa: E402
from harness.gunicorn import database_url, gunicorn_running  # noqa: E402
from harness.providers import sqlite_provider_init  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402

# (fleet role, what this benchmark calls it): the library, the baseline it is held to, and
# the plain-socket loop of ``bench/api.py`` as a third figure.
ROLES = (("library", "library"), ("httpx", "raw httpx"), ("sockets", "raw sockets"))


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
    # Wall time of one whole lifecycle in the client's loop: its "<role> run" entry.
    walls = [call[3] for r in results for call in r["calls"]]
    requests = sum(r["requests"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    return {
        "role": role,
        "lifecycles_per_s": lifecycles / args.seconds,
        "requests": requests,
        "client_cpu_ms_per_request": 1000 * cpu / requests if requests else 0.0,
        "client_cpu_ms_per_lifecycle": 1000 * cpu / lifecycles if lifecycles else 0.0,
        "lifecycle_ms_p50": statistics.median(walls) if walls else 0.0,
        "unexpected": sum(len(r["unexpected"]) for r in results),
    }


def order(n: int) -> list[str]:
    """Round ``n``'s order of the roles: each goes first, second and last in turn."""
    roles = [role for role, _ in ROLES]
    return roles[n % len(roles) :] + roles[: n % len(roles)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each role")
    args = parser.parse_args()
    if db.vendor != "postgresql":
        sys.exit("bench/client.py measures PostgreSQL; set DATABASE_URL=postgres://…")
    names = dict(ROLES)
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
        # One token stands for the whole fleet: no limit per credential (bench/api.py).
        env = {
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
            "SETTLE_HOST_RATE_PER_SECOND": "0",
        }
        with gunicorn_running(
            database_url=database_url(settings), log_path=scratch / "gunicorn.log", env=env
        ) as server:
            round_of(server.url, tokens, provider, "lifecycle", _warm(args), "warm")
            for n in range(args.rounds):
                for role in order(n):
                    analyze()
                    result = round_of(server.url, tokens, provider, role, args, f"{role}{n}")
                    rounds.append(result)
                    print(
                        f"{names[role]:11} {result['lifecycles_per_s']:7.1f} lifecycles/s, "
                        f"client CPU {result['client_cpu_ms_per_request']:.3f} ms/request "
                        f"{result['client_cpu_ms_per_lifecycle']:.2f} ms/lifecycle, "
                        f"lifecycle p50 {result['lifecycle_ms_p50']:.1f} ms, "
                        f"unexpected {result['unexpected']}",
                        flush=True,
                    )

    def mean(role: str, figure: str) -> float:
        return sum(r[figure] for r in rounds if r["role"] == role) / args.rounds

    rate = {role: mean(role, "lifecycles_per_s") for role, _ in ROLES}
    cpu = {role: mean(role, "client_cpu_ms_per_request") for role, _ in ROLES}
    per_run = {role: mean(role, "client_cpu_ms_per_lifecycle") for role, _ in ROLES}
    share = rate["library"] / rate["httpx"] if rate["httpx"] else 0.0
    of_sockets = rate["library"] / rate["sockets"] if rate["sockets"] else 0.0
    own = per_run["library"] - per_run["httpx"]
    # Each cycle (one round of every role, back to back) as its own comparison: the load
    # of a shared machine drifts between cycles more than within one.
    by_cycle = [
        {r["role"]: r["lifecycles_per_s"] for r in rounds[n * len(ROLES) : (n + 1) * len(ROLES)]}
        for n in range(args.rounds)
    ]
    cycle_shares = [c["library"] / c["httpx"] for c in by_cycle if c["httpx"]]
    median_share = statistics.median(cycle_shares) if cycle_shares else 0.0
    p50 = {role: mean(role, "lifecycle_ms_p50") for role, _ in ROLES}
    print(
        f"library {rate['library']:.1f}/s = {100 * share:.1f} % of raw httpx "
        f"{rate['httpx']:.1f}/s (target 95 %: {'met' if share >= 0.95 else 'not met'}), "
        f"{100 * of_sockets:.1f} % of raw sockets {rate['sockets']:.1f}/s, "
        f"at {args.clients} clients; per cycle "
        f"{', '.join(f'{100 * share:.0f} %' for share in cycle_shares)} "
        f"(median {100 * median_share:.1f} %)"
    )
    print(
        f"lifecycle p50: library {p50['library']:.1f} ms, raw httpx {p50['httpx']:.1f} ms, "
        f"raw sockets {p50['sockets']:.1f} ms"
    )
    print(
        f"client CPU per request: library {cpu['library']:.3f} ms, raw httpx "
        f"{cpu['httpx']:.3f} ms, raw sockets {cpu['sockets']:.3f} ms; the library's own "
        f"CPU per run (library minus raw httpx) {own:.2f} ms"
    )
    print(
        json.dumps(
            {
                "clients": args.clients,
                "seconds_per_round": args.seconds,
                "rounds": args.rounds,
                "library_lifecycles_per_s": round(rate["library"], 1),
                "raw_httpx_lifecycles_per_s": round(rate["httpx"], 1),
                "raw_sockets_lifecycles_per_s": round(rate["sockets"], 1),
                "library_share_of_raw_httpx": round(share, 3),
                "library_share_of_raw_httpx_cycle_median": round(median_share, 3),
                "library_share_of_raw_sockets": round(of_sockets, 3),
                "library_lifecycle_ms_p50": round(p50["library"], 1),
                "raw_httpx_lifecycle_ms_p50": round(p50["httpx"], 1),
                "raw_sockets_lifecycle_ms_p50": round(p50["sockets"], 1),
                "library_cpu_ms_per_request": round(cpu["library"], 3),
                "raw_httpx_cpu_ms_per_request": round(cpu["httpx"], 3),
                "raw_sockets_cpu_ms_per_request": round(cpu["sockets"], 3),
                "library_own_cpu_ms_per_run": round(own, 3),
                "unexpected": sum(r["unexpected"] for r in rounds),
            }
        )
    )


def _warm(args: Any) -> Any:
    return argparse.Namespace(seconds=1.5, clients=1)


if __name__ == "__main__":
    main()
