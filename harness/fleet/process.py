"""A fleet client's process: ``python harness/fleet/process.py --url URL --name NAME ...``.

It prints ``ready``, waits for the go file, runs its role until ``--seconds`` after the go
file appeared, and writes what it recorded to ``--out`` (JSON), as ``harness.fleet`` says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from harness.fleet.api import Api  # noqa: E402
from harness.fleet.client import Client, Provider  # noqa: E402
from harness.fleet.roles import ROLES  # noqa: E402
from harness.processes import emit, wait_for_file  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True, help="client name; also its keys' prefix")
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--index", type=int, default=0, help="index among clients of the role")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--go-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--providers", default="[]", help="JSON list of providers")
    parser.add_argument("--shared-dir", default="")
    parser.add_argument("--gate-timeout", type=float, default=120.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    api = Api(
        args.url,
        os.environ.get("SETTLE_HOST_TOKEN", ""),
        os.environ.get("SETTLE_APPROVER_TOKEN", ""),
    )
    client = Client(
        api=api,
        name=args.name,
        index=args.index,
        providers=[Provider(**p) for p in json.loads(args.providers)],
        shared_dir=Path(args.shared_dir) if args.shared_dir else None,
    )
    emit("ready")
    wait_for_file(args.go_file, args.gate_timeout, "go")
    client.t0 = os.stat(args.go_file).st_mtime
    client.deadline = client.t0 + args.seconds
    started = time.time()
    client.cpu_started = time.process_time()
    ROLES[args.role](client)
    result = {
        "name": args.name,
        "role": args.role,
        "started": started,
        "finished": time.time(),
        "cpu": time.process_time() - client.cpu_started,  # this client's own, in its loop
        "lifecycles": client.lifecycles,
        "requests": client.requests,
        "calls": api.calls,
        "unexpected": api.unexpected,
        "tokens": dict(client.tokens),
        "keys": client.keys,
        "violations": client.violations,
        "resumes": dict(client.resumes),
    }
    temporary = Path(args.out + ".tmp")
    temporary.write_text(json.dumps(result), "utf-8")
    temporary.replace(args.out)
    emit("done", calls=len(api.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
