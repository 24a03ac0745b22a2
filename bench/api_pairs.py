"""Two checkouts' host API, alternated run by run: the ratio of their lifecycle rates.

    python bench/api_pairs.py --baseline ../settle-base [--new .] [--pairs 3] \\
        [--clients 8,32] [--seconds 10] [--auto-approve]

Each checkout runs its own ``bench/api.py`` with its own ``.venv`` (a fresh scratch
database and a fresh gunicorn each time), baseline then new, ``--pairs`` times, so both
see the same minutes of a shared machine. ``DATABASE_URL`` chooses the server for both.
It prints, per pair and client count, each side's lifecycles/s, errors and gunicorn CPU
ms per request, the ratio new / baseline, and the load average; then the medians. The
whole output of every run is kept in ``--keep`` (default: a temporary folder, printed).
``--auto-approve`` runs the policy-approved lifecycle on both sides (``bench/api.py``'s
option of that name: a policy approves every opening), each side with its own requests.
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
    r"(?P<postgres>[\d.]+|n/a) /",
    re.MULTILINE,
)
LIFECYCLE_SQL = re.compile(r"^\| whole lifecycle \| (?P<sql>[\d.]+) \|", re.MULTILINE)


def run_once(checkout: Path, args: argparse.Namespace, log: Path) -> dict[int, dict[str, float]]:
    """One ``bench/api.py`` run of ``checkout``; its figures by client count."""
    command = [
        str(checkout / ".venv" / "bin" / "python"),
        "bench/api.py",
        "--seconds",
        str(args.seconds),
        "--clients",
        ",".join(str(n) for n in args.clients),
        *(["--auto-approve"] if args.auto_approve else []),
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
            "errors": float(match["errors"]),
            "gunicorn": float(match["gunicorn"]) if match["gunicorn"] != "n/a" else float("nan"),
            "postgres": float(match["postgres"]) if match["postgres"] != "n/a" else float("nan"),
            "load": load,
            "sql": float(sql["sql"]) if sql else float("nan"),
        }
    return figures


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
    parser.add_argument("--keep", type=Path, default=None, help="folder for each run's output")
    args = parser.parse_args()
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
    cpu: dict[str, dict[int, list[float]]] = {s: {n: [] for n in args.clients} for s in sides}
    for pair in range(1, args.pairs + 1):
        found = {
            side: run_once(checkout, args, keep / f"pair{pair}-{side}.txt")
            for side, checkout in sides.items()
        }
        for clients in args.clients:
            b, n = found["baseline"].get(clients), found["new"].get(clients)
            if b is None or n is None:
                print(f"| {pair} | {clients} | (missing: see {keep}) |", flush=True)
                continue
            ratio = n["rate"] / b["rate"] if b["rate"] else float("nan")
            ratios[clients].append(ratio)
            cpu["baseline"][clients].append(b["gunicorn"])
            cpu["new"][clients].append(n["gunicorn"])
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
            print(
                f"{clients} clients: median ratio {statistics.median(ratios[clients]):.2f} over "
                f"{len(ratios[clients])} pairs; gunicorn CPU ms/request median "
                f"{statistics.median(cpu['baseline'][clients]):.2f} (baseline) / "
                f"{statistics.median(cpu['new'][clients]):.2f} (new)"
            )


if __name__ == "__main__":
    main()
