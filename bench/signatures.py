"""Verifying decisions signed with a passkey (``manage.py benchmark_signatures``).

    python manage.py benchmark_signatures --events N [--signed 0.1] [--repeat 2]

Figures, not a test. Two measurements:

one signed decision
    The audit log's check of one signed vote (``audit.signed_decisions.Passkeys.vote_problem``:
    the registration, the statement, the relying party, the P-256 signature), over a
    few thousand distinct votes: mean and percentiles per vote.
verify_audit, signed against unsigned
    N events seeded (chains of four, as ``benchmark_audit`` seeds them, and the system
    chain's ``passkey_added`` events of ten people), none signed, then the same log with
    ``--signed`` of its events signed votes instead; ``verify_audit --no-checkpoint`` run
    ``--repeat`` times on each (each in a process of its own), the fastest of each and
    their ratio, and the ratio of the medians.

The log is cleared between the two and at the end (as a table owner: PostgreSQL's
append-only triggers are skipped for it), so the database must hold no audit events to
begin with: give it one of its own. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, OutputWrapper
from django.db import connection
from django.utils import timezone

from audit.hashing import SYSTEM_CHAIN, timestamp
from audit.models import AuditChainHead, AuditEvent
from audit.signed_decisions import Passkeys
from bench.audit import _measured
from bench.seed import AUDIT_COLUMNS, SPAN, Chain, Writer, analyze
from common.statements import statement
from harness.webauthn import SoftPasskey

PEOPLE = 10
_AUDIT_TABLES = (
    "audit_auditevent",
    "audit_auditchainhead",
    "audit_auditverifyjob",
    "audit_auditverification",
)


def _person(n: int) -> str:
    return f"user:{n + 1}:person-{n}"


class SignedLog:
    """People with passkeys, and the signed votes they make."""

    def __init__(self, people: int = PEOPLE) -> None:
        self.passkeys = [
            SoftPasskey(rp_id="localhost", origin="https://localhost") for _ in range(people)
        ]

    def added_data(self, n: int) -> dict[str, Any]:
        passkey = self.passkeys[n]
        return {
            "user": f"person-{n}",
            "user_id": n + 1,
            "authenticator_id": n + 1,
            "name": "Work laptop",
            "credential_id": passkey.id,
            "public_key": passkey.public_key,
        }

    def vote(self, chain: str, n: int) -> dict[str, Any]:
        """An ``approval_voted`` event's data, signed by person ``n``'s passkey."""
        digest = "sha256:" + os.urandom(32).hex()
        signed = statement(
            "approval",
            approval_id=str(uuid.uuid4()),
            operation_key=chain,
            params_digest=digest,
            decision="approve",
            person=_person(n),
        )
        return {
            "approval_id": signed["approval_id"],
            "decision": "approve",
            "reason": "",
            "params_digest": digest,
            "approvals": 1,
            "required": 1,
            "signature": self.passkeys[n].record(signed),
        }

    def seed(self, n: int, *, signed: float, chain_length: int = 4) -> int:
        """``n`` events in chains of ``chain_length``, ``signed`` of them signed votes,
        after the system chain's registration of every person's passkey."""
        now = timezone.now()
        start = now - SPAN
        step = SPAN / max(n, 1)
        system = Chain(SYSTEM_CHAIN)
        registered = [
            system.event(
                start - timedelta(hours=1), "passkey_added", _person(i), self.added_data(i)
            )
            for i in range(len(self.passkeys))
        ]
        Writer(AuditEvent._meta.db_table, AUDIT_COLUMNS).write(registered)
        AuditChainHead.objects.update_or_create(
            chain=SYSTEM_CHAIN, defaults={"seq": system.seq, "hash": system.hash}
        )

        def rows() -> Any:
            chain: Chain | None = None
            votes = 0
            for i in range(n):
                if chain is None or chain.seq >= chain_length:
                    chain = Chain(f"audit-{i:09d}")
                at = start + step * i
                if int((i + 1) * signed) > votes:
                    person = votes % len(self.passkeys)
                    votes += 1
                    yield chain.event(
                        at, "approval_voted", _person(person), self.vote(chain.key, person)
                    )
                else:
                    yield chain.event(
                        at, "transition", "system:bench:bench", {"event": "bench", "i": i}
                    )

        made = Writer(AuditEvent._meta.db_table, AUDIT_COLUMNS).write(rows())
        analyze()
        return made + len(registered)


def _log_cleared() -> None:
    """Every audit event, chain head and verification gone, as a table owner would."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET session_replication_role = replica")
            cursor.execute(f"TRUNCATE {', '.join(_AUDIT_TABLES)}")
            cursor.execute("SET session_replication_role = DEFAULT")
        else:
            for table in _AUDIT_TABLES:
                cursor.execute(f"DELETE FROM {table}")


class SignatureBenchmark:
    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout

    def run(self, *, events: int, signed: float, repeat: int, votes: int) -> dict[str, Any]:
        if AuditEvent.objects.exists():
            raise CommandError(
                "this database already holds audit events: benchmark_signatures seeds and "
                "clears its own. Point DATABASE_URL at an empty database of its own."
            )
        log = SignedLog()
        figures: dict[str, Any] = {"one_signed_decision": self._one(log, votes)}
        self.stdout.write(f"one signed decision: {figures['one_signed_decision']}")
        with tempfile.TemporaryDirectory(prefix="settle-bench-signatures-") as scratch:
            env = {
                **os.environ,
                "SETTLE_AUDIT_CHECKPOINT_FILE": str(Path(scratch) / "checkpoints.jsonl"),
                "SETTLE_AUDIT_KEY": settings.SETTLE_AUDIT_KEY,
            }
            try:
                for share in (0.0, signed):
                    figures[f"signed_{share:g}"] = self._verify(log, events, share, repeat, env)
            finally:
                _log_cleared()
        unsigned, with_signed = figures["signed_0"], figures[f"signed_{signed:g}"]
        figures["ratio_work"] = round(with_signed["work_seconds"] / unsigned["work_seconds"], 3)
        figures["ratio_wall"] = round(with_signed["seconds"] / unsigned["seconds"], 3)
        figures["ratio_median"] = round(
            with_signed["median_work_seconds"] / unsigned["median_work_seconds"], 3
        )
        self.stdout.write(
            f"verify_audit over {unsigned['events']} events: "
            f"unsigned {unsigned['work_seconds']} s, "
            f"{signed:.0%} signed {with_signed['work_seconds']} s (work): "
            f"ratio {figures['ratio_work']} (wall {figures['ratio_wall']}, "
            f"of the medians {figures['ratio_median']})"
        )
        self.stdout.write(json.dumps(figures))
        return figures

    def _one(self, log: SignedLog, votes: int) -> dict[str, Any]:
        """Each of ``votes`` distinct signed votes checked as verify_audit checks them."""
        passkeys = Passkeys()
        for n in range(len(log.passkeys)):
            passkeys.event("passkey_added", "2000-01-01T00:00:00.000000Z", log.added_data(n))
        made = [log.vote("op-1", n % len(log.passkeys)) for n in range(votes)]
        at = timestamp(timezone.now())
        times = []
        for n, data in enumerate(made):
            began = time.perf_counter()
            problem = passkeys.vote_problem(
                chain="op-1", actor=_person(n % len(log.passkeys)), at=at, data=data
            )
            times.append(time.perf_counter() - began)
            if problem is not None:
                raise CommandError(f"a benchmark vote does not verify: {problem}")
        times.sort()
        return {
            "votes": votes,
            "mean_ms": round(statistics.fmean(times) * 1000, 3),
            "p50_ms": round(times[len(times) // 2] * 1000, 3),
            "p99_ms": round(times[int(len(times) * 0.99)] * 1000, 3),
        }

    def _verify(
        self, log: SignedLog, events: int, share: float, repeat: int, env: dict[str, str]
    ) -> dict[str, Any]:
        _log_cleared()
        began = time.perf_counter()
        made = log.seed(events, signed=share)
        self.stdout.write(
            f"seeded {made} events, {share:.0%} signed, in {time.perf_counter() - began:.1f} s"
        )
        runs = []
        for _ in range(repeat):
            # A broken log exits non-zero, and _measured raises.
            run = _measured(["verify_audit", "--no-checkpoint"], env)
            # The machine is shared: the load beside each run says what it competed with.
            run["load"] = round(os.getloadavg()[0], 2)
            runs.append(run)
            self.stdout.write(f"verify_audit, {share:.0%} signed: {run}")
        fastest = min(runs, key=lambda run: run["work_seconds"])
        return {
            "events": made,
            "signed_share": share,
            "seconds": fastest["seconds"],
            "work_seconds": fastest["work_seconds"],
            "median_work_seconds": statistics.median(run["work_seconds"] for run in runs),
            "peak_mb": fastest["peak_mb"],
            "runs_work_seconds": [run["work_seconds"] for run in runs],
            "runs_load": [run["load"] for run in runs],
        }
