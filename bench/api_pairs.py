"""Two checkouts' host API, alternated run by run: the ratio of their lifecycle rates.

    python bench/api_pairs.py --baseline ../settle-base [--new .] [--pairs 3] \\
        [--clients 8,32] [--seconds 10] [--auto-approve]

Each checkout runs its own ``bench/api.py`` with its own ``.venv`` (a fresh scratch
database and a fresh gunicorn each time), baseline then new, ``--pairs`` times, so both
see the same minutes of a shared machine. ``DATABASE_URL`` chooses the server for both.
It prints, per pair and client count, each side's lifecycles/s, errors and gunicorn CPU
ms per request, the ratio new / baseline, and the load average; then the medians, and
each side's CPU per lifecycle: each process group's CPU per request (gunicorn,
PostgreSQL, the clients, the rest of the machine) times the requests a lifecycle made,
their sum, and the machine's CPU time per lifecycle at the rate measured (its cores over
the rate). Where the machine is CPU-bound the two agree: the rate is then the cores
divided by what a lifecycle costs all processes together, the clients included. The
whole output of every run is kept in ``--keep`` (default: a temporary folder, printed).
``--auto-approve`` runs the policy-approved lifecycle on both sides (``bench/api.py``'s
option of that name: a policy approves every opening), each side with its own requests.
The new side's clients make their requests on plain sockets (``--new-client sockets``,
``bench/api.py --client sockets``), as the baseline's hand-written client does, so that
the ratio compares the servers and not two clients' costs on the same cores;
``--new-client library`` runs them through ``settle-client`` instead. Against a baseline
recent enough to have ``--client`` itself, ``--baseline-client sockets`` gives it the
same clients (its own default is the library).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = re.compile(
    r"^\| API, (?P<clients>\d+) clients? \| (?P<rate>[\d.]+) lifecycles/s \((?P<requests>\d+) "
    r"requests/s\) \| [^|]*\| [^|]*\| (?P<errors>\d+) \| (?P<gunicorn>[\d.]+|n/a) / "
    r"(?P<postgres>[\d.]+|n/a) / (?P<clients_cpu>[\d.]+|n/a) / (?P<rest>[\d.]+|n/a) \|",
    re.MULTILINE,
)
LIFECYCLE_SQL = re.compile(r"^\| whole lifecycle \| (?P<sql>[\d.]+) \|", re.MULTILINE)


# Where each request's CPU goes, as bench/api.py prints it: its column, and the group here.
CPU_PARTS = {
    "gunicorn": "gunicorn",
    "postgres": "postgres",
    "clients": "clients_cpu",
    "rest": "rest",
}


def _ms(text: str) -> float:
    return float(text) if text != "n/a" else float("nan")


def run_once(
    checkout: Path, args: argparse.Namespace, log: Path, client: str
) -> dict[int, dict[str, float]]:
    """One ``bench/api.py`` run of ``checkout``, its clients ``client`` ("" for that
    checkout's own); its figures by client count."""
    command = [
        str(checkout / ".venv" / "bin" / "python"),
        "bench/api.py",
        "--seconds",
        str(args.seconds),
        "--clients",
        ",".join(str(n) for n in args.clients),
        *(["--auto-approve"] if args.auto_approve else []),
        *(["--client", client] if client else []),
    ]
    load = os.getloadavg()[0]
    done = subprocess.run(
        command, cwd=checkout, capture_output=True, text=True, timeout=900, check=False
    )
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{checkout}: bench/api.py failed (exit {done.returncode}); see {log}")
    sql = LIFECYCLE_SQL.search(done.stdout)
    figures: dict[int, dict[str, float]] = {}
    for match in RUN.finditer(done.stdout):
        figures[int(match["clients"])] = {
            "rate": float(match["rate"]),
            "requests": float(match["requests"]),
            "errors": float(match["errors"]),
            **{part: _ms(match[group]) for part, group in CPU_PARTS.items()},
            "load": load,
            "sql": float(sql["sql"]) if sql else float("nan"),
        }
    return figures


def lifecycle_cpu(runs: list[dict[str, float]]) -> str:
    """One side's CPU per lifecycle, part by part (each part's CPU per request times the
    requests a lifecycle made in that run; the mean over the runs), their sum, and what
    the machine's cores allow a lifecycle at the rate measured: where the machine is
    CPU-bound, the two agree, and the rate is the cores over the sum."""
    per = {
        part: statistics.fmean(run[part] * run["requests"] / run["rate"] for run in runs)
        for part in CPU_PARTS
    }
    allowed = statistics.fmean((os.cpu_count() or 1) * 1000 / run["rate"] for run in runs)
    requests = statistics.fmean(run["requests"] / run["rate"] for run in runs)
    return (
        f"{requests:.1f} | {per['gunicorn']:.1f} | {per['postgres']:.1f} | {per['clients']:.1f} "
        f"| {per['rest']:.1f} | {sum(per.values()):.1f} | {allowed:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",") if n.strip()],
        default=[8, 32],
    )
    parser.add_argument(
        "--auto-approve",
        action="store_true",
        help="the policy-approved lifecycle on both sides (bench/api.py --auto-approve)",
    )
    parser.add_argument(
        "--new-client",
        choices=("sockets", "library"),
        default="sockets",
        help="the new side's clients (bench/api.py --client): plain sockets, as cheap as "
        "the baseline's hand-written client, or settle-client",
    )
    parser.add_argument(
        "--baseline-client",
        choices=("", "sockets", "library"),
        default="",
        help="the baseline's clients: its own bench/api.py's default (81c1a7e's are on "
        "sockets), or, for a baseline that has the option, --client sockets or library",
    )
    parser.add_argument("--keep", type=Path, default=None, help="folder for each run's output")
    args = parser.parse_args()
    # The baseline's bench/api.py drives its own lifecycle (81c1a7e's: a hand-written
    # client on sockets); the new side's clients are the same kind unless asked otherwise.
    clients_of = {"baseline": args.baseline_client, "new": args.new_client}
    keep = args.keep or Path(tempfile.mkdtemp(prefix="api-pairs-"))
    keep.mkdir(parents=True, exist_ok=True)
    sides = {"baseline": args.baseline.resolve(), "new": args.new.resolve()}
    print(f"baseline {sides['baseline']}, new {sides['new']}; runs kept in {keep}", flush=True)
    print(
        "| pair | clients | baseline lifecycles/s | new lifecycles/s | ratio | errors b / n "
        "| gunicorn CPU ms/request b / n | PostgreSQL CPU ms/request b / n "
        "| SQL per lifecycle b / n | load (1 min) b / n |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    ratios: dict[int, list[float]] = {n: [] for n in args.clients}
    runs: dict[str, dict[int, list[dict[str, float]]]] = {
        s: {n: [] for n in args.clients} for s in sides
    }
    for pair in range(1, args.pairs + 1):
        found = {
            side: run_once(checkout, args, keep / f"pair{pair}-{side}.txt", clients_of[side])
            for side, checkout in sides.items()
        }
        for clients in args.clients:
            b, n = found["baseline"].get(clients), found["new"].get(clients)
            if b is None or n is None:
                print(f"| {pair} | {clients} | (missing: see {keep}) |", flush=True)
                continue
            ratio = n["rate"] / b["rate"] if b["rate"] else float("nan")
            ratios[clients].append(ratio)
            runs["baseline"][clients].append(b)
            runs["new"][clients].append(n)
            print(
                f"| {pair} | {clients} | {b['rate']:.1f} | {n['rate']:.1f} | {ratio:.2f} "
                f"| {b['errors']:g} / {n['errors']:g} | {b['gunicorn']:.2f} / {n['gunicorn']:.2f} "
                f"| {b['postgres']:.2f} / {n['postgres']:.2f} | {b['sql']:g} / {n['sql']:g} "
                f"| {b['load']:.1f} / {n['load']:.1f} |",
                flush=True,
            )
    print()
    for clients in args.clients:
        if ratios[clients]:
            gunicorn = {
                side: statistics.median(run["gunicorn"] for run in runs[side][clients])
                for side in sides
            }
            print(
                f"{clients} clients: median ratio {statistics.median(ratios[clients]):.2f} over "
                f"{len(ratios[clients])} pairs; gunicorn CPU ms/request median "
                f"{gunicorn['baseline']:.2f} (baseline) / {gunicorn['new']:.2f} (new)"
            )
    print(
        f"\n| side | clients | requests a lifecycle | CPU ms a lifecycle: gunicorn | PostgreSQL "
        f"| clients | rest | sum | {os.cpu_count()} cores' ms at the rate measured |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for clients in args.clients:
        for side in sides:
            if runs[side][clients]:
                print(f"| {side} | {clients} | {lifecycle_cpu(runs[side][clients])} |")


if __name__ == "__main__":
    main()
