"""A demo worker: one OS process driving one operation through the host HTTP API.

Run by ``manage.py demo`` as ``python -m console.demo.worker --scenario ...`` with the
host and approver tokens in ``SETTLE_HOST_TOKEN`` and ``SETTLE_APPROVER_TOKEN``. It needs
no Django: the standard library and ``recovery.canonical`` (to compute the digest the
provider stores). Every step is one JSON line on stdout, flushed, so that the demo can
SIGKILL it exactly at ``holding``: the worker then sleeps (bounded), holding a dispatch
it will never report.

Scenarios (the effect is written at the provider's file, as the provider's tool would):

``normal``        commit at the provider, report ``committed``
``after_commit``  commit at the provider, then hold (the demo kills it before the report)
``before_commit`` hold right after the dispatch, before anything reaches the provider
``other_params``  the provider records other parameters than the approved ones, then hold
``corrupt``       the journal line is written with a wrong checksum, then hold
``provider_down`` the provider cannot be reached; the worker reports ``failed``
``awaiting``      register and ask for an approval; nobody decides it
``resume``        a replacement worker asks ``resume`` for an operation another one held,
                  until the lookup it queued has settled what it can
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from recovery.canonical import canonical_dumps, canonical_params, params_digest, sha256_digest

SCENARIOS = (
    "normal",
    "after_commit",
    "before_commit",
    "other_params",
    "corrupt",
    "provider_down",
    "awaiting",
    "resume",
)
# How many times a replacement worker asks resume while its lookup is under way.
RESUME_POLLS = 30
# A local server: never through a proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ProviderDown(Exception):
    """The provider could not be reached: nothing was committed there."""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def call(url: str, token: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One API call; an HTTP error status is an answer, returned like any other."""
    request = urllib.request.Request(
        url.rstrip("/") + "/api/v1" + path,
        data=None if body is None else json.dumps(body).encode("utf-8"),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with _DIRECT.open(request, timeout=30) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        status, raw = int(exc.code), exc.read()
        exc.close()
    answer = json.loads(raw)
    emit("answer", path=path, status=status, body=answer)
    if not 200 <= status < 300:
        raise SystemExit(2)
    return answer


# -- the providers' own tools: what writes the records Settle's adapters read ----------


def sqlite_commit(path: str, *, key: str, params: dict[str, Any], reference: str) -> None:
    """The order row and its exact-parameter receipt, in one transaction."""
    params_json = canonical_params(params)
    connection = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(
            "INSERT INTO orders (operation_key, reference, status, created_at) "
            "VALUES (?, ?, 'committed', ?)",
            (key, reference, datetime.now(UTC).isoformat()),
        )
        connection.execute(
            "INSERT INTO receipts (operation_key, params_json, params_digest) VALUES (?, ?, ?)",
            (key, params_json, params_digest(params_json)),
        )
        connection.execute("COMMIT")
    finally:
        connection.close()


def journal_append(path: str, *, key: str, digest: str, reference: str, corrupt: bool) -> None:
    """One checksummed line, fsynced; the flock keeps ``seq`` unique across workers."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        handle.seek(0)
        seq = sum(1 for _ in handle) + 1
        record: dict[str, Any] = {
            "seq": seq,
            "operation_key": key,
            "params_digest": digest,
            "reference": reference,
            "status": "committed",
            "committed_at": datetime.now(UTC).isoformat(),
        }
        checksum = sha256_digest(canonical_dumps(record))
        if corrupt:
            checksum = sha256_digest(checksum.encode("utf-8"))
        record["checksum"] = checksum
        handle.seek(0, os.SEEK_END)
        handle.write(canonical_dumps(record) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def commit_at_provider(args: argparse.Namespace, params: dict[str, Any], reference: str) -> None:
    if args.scenario == "provider_down":
        raise ProviderDown(f"{args.provider} did not answer")
    if args.scenario == "other_params":
        params = {**params, "amount": params.get("amount", 0) * 10}
    if args.adapter == "sqlite":
        sqlite_commit(args.provider_path, key=args.key, params=params, reference=reference)
    else:
        digest = params_digest(canonical_params(params))
        corrupt = args.scenario == "corrupt"
        journal_append(
            args.provider_path, key=args.key, digest=digest, reference=reference, corrupt=corrupt
        )


def hold(stage: str, seconds: float) -> int:
    emit("holding", stage=stage)
    time.sleep(seconds)
    emit("hold_expired", stage=stage)
    return 4


def run(args: argparse.Namespace, host: str, approver: str) -> int:
    url, key = args.url, args.key
    if args.scenario == "resume":
        # As a host's replacement worker does: while a lookup of the operation is under
        # way (in_progress), ask again after the wait resume names; bounded.
        for _ in range(RESUME_POLLS):
            answer = call(url, host, f"/operations/{key}/resume", {"worker": args.worker})
            if answer["decision"] != "in_progress":
                break
            time.sleep(min(float(answer.get("retry_after", 1)), 2.0))
        emit("done")
        return 0
    params = json.loads(args.params)
    call(
        url,
        host,
        "/operations",
        {"key": key, "action": args.action, "provider": args.provider, "params": params},
    )
    opened = call(url, host, f"/operations/{key}/approvals", {})
    if args.scenario == "awaiting":
        emit("done")
        return 0
    # The approver's phone: it reads the exact action and approves the digest it saw.
    approval = call(url, approver, f"/approvals/{opened['approval_id']}")
    digest = approval["params_digest"]
    call(
        url,
        approver,
        f"/approvals/{opened['approval_id']}/decision",
        {"decision": "approve", "ttl_seconds": 300, "params_digest": digest},
    )
    dispatched = call(
        url, host, f"/operations/{key}/dispatch", {"worker": args.worker, "params_digest": digest}
    )
    token = dispatched["fencing_token"]
    if args.scenario == "before_commit":
        return hold("before_commit", args.hold_seconds)
    reference = f"ref-{key}"
    try:
        commit_at_provider(args, params, reference)
    except ProviderDown as exc:
        emit("provider_down", error=str(exc))
        call(url, host, f"/operations/{key}/result", {"fencing_token": token, "outcome": "failed"})
        emit("done")
        return 0
    emit("effect_committed", reference=reference)
    if args.scenario != "normal":
        return hold("after_commit", args.hold_seconds)
    call(
        url,
        host,
        f"/operations/{key}/result",
        {"fencing_token": token, "outcome": "committed", "provider_reference": reference},
    )
    emit("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--action", default="order.place")
    parser.add_argument("--provider", default="")
    parser.add_argument("--adapter", choices=("sqlite", "journal", "http"), default="sqlite")
    parser.add_argument("--provider-path", default="")
    parser.add_argument("--params", default="{}")
    parser.add_argument("--hold-seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    host = os.environ.get("SETTLE_HOST_TOKEN", "")
    approver = os.environ.get("SETTLE_APPROVER_TOKEN", "")
    try:
        return run(args, host, approver)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
