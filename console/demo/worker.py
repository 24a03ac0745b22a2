"""A demo worker: one OS process driving one operation through the host HTTP API.

Run by ``manage.py demo`` as ``python -m console.demo.worker --scenario ...`` with the
host and approver tokens in ``SETTLE_HOST_TOKEN`` and ``SETTLE_APPROVER_TOKEN``. It needs
no Django: ``settle_client`` runs the host protocol (``Host.run``), and
``canonical`` computes the digest the provider stores. Every step is one JSON
line on stdout, flushed, so that the demo can SIGKILL it exactly at ``holding``: the
worker then sleeps (bounded), holding a dispatch it will never report.

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
from datetime import UTC, datetime
from typing import Any

import settle_client

from common.canonical import canonical_dumps, canonical_params, params_digest, sha256_digest

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
# How long a replacement worker waits for the lookup it queued to settle what it can.
RESUME_SECONDS = 8.0


class ProviderDown(Exception):
    """The provider could not be reached: nothing was committed there."""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


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
    raise SystemExit(4)


def run(args: argparse.Namespace, host_token: str, approver_token: str) -> int:
    """One ``settle_client.Host.run``: the protocol is the client library's, not this file's.

    The approver's phone (``on_approval``) reads the exact action and approves the digest
    it saw; the effect is the provider's tool, stopped where the scenario says.
    """
    params = json.loads(args.params)
    reference = f"ref-{args.key}"

    def approve(approval_id: str) -> None:
        emit("approval", approval_id=approval_id)
        if args.scenario == "awaiting":
            return
        with settle_client.Approver(args.url, approver_token, timeout=30) as phone:
            approval = phone.approval(approval_id)
            phone.decide(approval, approve=True)

    def effect(fencing_token: str) -> str:
        if args.scenario == "resume":
            emit("effect_called")  # a replacement never runs it: Settle must not allow it
            raise RuntimeError("a replacement worker was handed a dispatch")
        emit("dispatched")
        if args.scenario == "before_commit":
            hold("before_commit", args.hold_seconds)
        try:
            commit_at_provider(args, params, reference)
        except ProviderDown as exc:
            emit("provider_down", error=str(exc))
            raise
        emit("effect_committed", reference=reference)
        if args.scenario != "normal":
            hold("after_commit", args.hold_seconds)
        return reference

    host = settle_client.Host(
        args.url,
        host_token,
        worker=args.worker,
        approval_timeout=0.0 if args.scenario == "awaiting" else 60.0,
        settle_timeout=RESUME_SECONDS,
        poll_interval=0.2,
    )
    with host:
        try:
            outcome = host.run(
                args.key,
                action=args.action,
                provider=args.provider,
                params=params,
                effect=effect,
                on_approval=approve,
            )
        except settle_client.ApprovalTimeout:
            decision = "wait"
        except settle_client.NeedsOperator as exc:
            decision = exc.reason
        except settle_client.OperationClosed:
            decision = "closed"
        else:
            decision = "released" if outcome.released else "closed"
    # What became of it, as resume would name it (the demo's report lists it).
    emit("answer", body={"decision": decision})
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
    except (settle_client.SettleError, OSError, ValueError) as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
