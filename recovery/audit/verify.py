"""Verifying the whole audit log: every chain, every checkpoint, the file outside.

``audit_verify`` reads every event once, in chain order, and checks it against its
predecessor, its own hash and every checkpoint that signed its seq — not only the
newest, so that a head signed again after a rewrite cannot hide what was signed
before. Then the stored heads (operations', the system chain's), the vouched heads and
the alarms. It names the first problem found.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from recovery.audit.alarms import alarm_signed
from recovery.audit.chain import _TIMESTAMP, GENESIS_HASH, SYSTEM_CHAIN, ChainBreak, event_break
from recovery.audit.checkpoints import checkpoint_digest, vouched_signed
from recovery.audit.keys import signed_by_key
from recovery.models import (
    AuditAlarm,
    AuditChainHead,
    AuditCheckpoint,
    AuditEvent,
    AuditVerification,
    AuditVouchedHead,
)
from recovery.vocabulary import AuditKind


def _checkpoint_problem(checkpoint: AuditCheckpoint, expected_prev: str) -> str | None:
    if checkpoint.prev_digest != expected_prev:
        return f"checkpoint #{checkpoint.number} does not follow its predecessor"
    if checkpoint_digest(checkpoint) != checkpoint.digest:
        return f"checkpoint #{checkpoint.number} was edited (its digest does not match)"
    if not signed_by_key(checkpoint.digest, checkpoint.signature):
        return f"checkpoint #{checkpoint.number} is not signed by the audit key"
    return None


def _checkpoints_verified() -> tuple[list[AuditCheckpoint], str | None]:
    """The checkpoints of the database, cross-checked with the file; or the problem."""
    stored = list(AuditCheckpoint.objects.order_by("number"))
    expected_prev = GENESIS_HASH
    for number, checkpoint in enumerate(stored, start=1):
        if checkpoint.number != number:
            return stored, f"checkpoint #{number} is missing from the database"
        problem = _checkpoint_problem(checkpoint, expected_prev)
        if problem:
            return stored, problem
        expected_prev = checkpoint.digest
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    if not path.exists():
        if stored:
            return stored, f"the checkpoint file {path} is missing"
        return stored, None
    by_number = {checkpoint.number: checkpoint for checkpoint in stored}
    from_file: list[AuditCheckpoint] = []
    expected_prev = GENESIS_HASH
    for line_number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            made_at = datetime.strptime(record["made_at"], _TIMESTAMP)
            checkpoint = AuditCheckpoint(
                number=int(record["number"]),
                made_at=made_at.replace(tzinfo=UTC),
                rescan_from=int(record["rescan_from"]),
                watermark=int(record["watermark"]),
                heads=record["heads"],
                broken=record.get("broken", []),
                prev_digest=str(record["prev_digest"]),
                digest=str(record["digest"]),
                signature=str(record["signature"]),
            )
        except (ValueError, KeyError, TypeError):
            return stored, f"line {line_number} of the checkpoint file is unreadable"
        problem = _checkpoint_problem(checkpoint, expected_prev)
        if problem:
            return stored, f"{problem} (checkpoint file, line {line_number})"
        expected_prev = checkpoint.digest
        in_database = by_number.get(checkpoint.number)
        if in_database is None:
            return stored, (
                f"checkpoint #{checkpoint.number} of the checkpoint file is missing from "
                "the database"
            )
        if in_database.digest != checkpoint.digest:
            return stored, f"checkpoint #{checkpoint.number} differs from the checkpoint file"
        from_file.append(checkpoint)
    return (stored if len(stored) >= len(from_file) else from_file), None


# chain → seq → [(hash, checkpoint number)]: every head every checkpoint signed.
Vouches = dict[str, dict[int, list[tuple[str, int]]]]


def _vouches(checkpoints: list[AuditCheckpoint]) -> Vouches:
    vouches: Vouches = {}
    for checkpoint in checkpoints:
        for chain, (seq, digest) in checkpoint.heads.items():
            vouches.setdefault(chain, {}).setdefault(int(seq), []).append(
                (str(digest), checkpoint.number)
            )
    return vouches


def _cut_problem(length: int, signed: dict[int, list[tuple[str, int]]] | None) -> str | None:
    """Events a checkpoint signed beyond the chain's ``length``: cut from its tail."""
    if not signed:
        return None
    seq = max(signed)
    if seq <= length:
        return None
    number = max(number for _, number in signed[seq])
    if length == 0:
        return f"every event of this chain is missing; checkpoint #{number} names {seq}"
    return f"events after #{length} are missing; checkpoint #{number} names #{seq} (cut)"


@dataclass
class VerifyTally:
    """How far a verification got: the events whose hashes it checked."""

    events: int = 0


def audit_verify(
    *, chunk_size: int = 5000, tally: VerifyTally | None = None
) -> Iterator[ChainBreak]:
    """Check every checkpoint and every chain; yield the first problem found (if any)."""
    tally = tally if tally is not None else VerifyTally()
    checkpoints, problem = _checkpoints_verified()
    if problem:
        yield ChainBreak("", 0, problem)
        return
    vouches = _vouches(checkpoints)
    unseen = set(vouches)
    chain: str | None = None
    length = 0
    prev_hash = GENESIS_HASH
    events = AuditEvent.objects.order_by("operation_key", "seq").iterator(chunk_size=chunk_size)
    for event in events:
        tally.events += 1
        if event.operation_key != chain:
            if chain is not None:
                cut = _cut_problem(length, vouches.get(chain))
                if cut:
                    yield ChainBreak(chain, length + 1, cut)
                    return
            chain, length, prev_hash = event.operation_key, 0, GENESIS_HASH
            unseen.discard(chain)
        found = event_break(event, seq=length + 1, prev_hash=prev_hash)
        if found is not None:
            yield found
            return
        for signed_hash, number in vouches.get(chain, {}).get(event.seq, ()):
            if signed_hash != event.hash:
                yield ChainBreak(
                    chain, event.seq, f"differs from what checkpoint #{number} signed (rewritten)"
                )
                return
        length, prev_hash = event.seq, event.hash
    if chain is not None:
        cut = _cut_problem(length, vouches.get(chain))
        if cut:
            yield ChainBreak(chain, length + 1, cut)
            return
    for missing in sorted(unseen):
        cut = _cut_problem(0, vouches[missing])
        if cut:
            yield ChainBreak(missing, 1, cut)
            return
    yield from _stored_heads_disagree()
    yield from _vouched_heads_disagree(vouches)
    yield from _alarms_disagree(checkpoints)


def _stored_heads_disagree() -> Iterator[ChainBreak]:
    """Chains whose stored head (operation row, system head) is not their last event.

    Catches a cut or rewrite of the newest events that left the stored head alone,
    even where no checkpoint covers them yet.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT o.key, o.audit_seq FROM recovery_operation o"
            " LEFT JOIN recovery_auditevent e ON e.operation_key = o.key AND e.seq = o.audit_seq"
            " WHERE (o.audit_seq > 0 AND (e.id IS NULL OR e.hash <> o.audit_hash))"
            " OR EXISTS (SELECT 1 FROM recovery_auditevent n"
            "  WHERE n.operation_key = o.key AND n.seq = o.audit_seq + 1)"
            " ORDER BY o.key LIMIT 1"
        )
        row = cursor.fetchone()
    if row is not None:
        key, seq = str(row[0]), int(row[1])
        yield ChainBreak(key, seq, "the operation's row names a different head for its chain")
        return
    last = (
        AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN)
        .order_by("-seq")
        .values_list("seq", "hash")
        .first()
    )
    head = AuditChainHead.objects.filter(chain=SYSTEM_CHAIN).values_list("seq", "hash").first()
    if last is None and (head is None or head[0] == 0):
        return
    if head is None:
        yield ChainBreak(SYSTEM_CHAIN, 0, "the system chain's head row is missing")
    elif last is None or (int(last[0]), str(last[1])) != (int(head[0]), str(head[1])):
        yield ChainBreak(
            SYSTEM_CHAIN, int(head[0]), "the system chain's head row names a different head"
        )


def _vouched_heads_disagree(vouches: Vouches) -> Iterator[ChainBreak]:
    """Vouched heads must be signed and be each chain's newest signed head, no other."""
    newest: dict[str, tuple[int, str, int]] = {}
    for chain, signed in vouches.items():
        seq = max(signed)
        digest, number = max(signed[seq], key=lambda entry: entry[1])
        newest[chain] = (seq, digest, number)
    for row in AuditVouchedHead.objects.order_by("chain").iterator(chunk_size=5000):
        expected = newest.pop(row.chain, None)
        if not vouched_signed(row):
            yield ChainBreak(row.chain, row.seq, "its vouched head is not signed by the audit key")
            return
        if expected != (row.seq, row.hash, row.checkpoint):
            yield ChainBreak(
                row.chain,
                row.seq,
                "its vouched head is not the newest head the checkpoints signed (rolled back)",
            )
            return
    for chain in sorted(newest):
        yield ChainBreak(chain, 0, "its vouched head is missing (deleted)")
        return


def _alarms_disagree(checkpoints: list[AuditCheckpoint]) -> Iterator[ChainBreak]:
    """Every alarm signed; every chain a checkpoint found broken has its alarm; every
    resolution on the record."""
    alarms = list(AuditAlarm.objects.order_by("id"))
    for alarm in alarms:
        if not alarm_signed(alarm):
            yield ChainBreak("", 0, f"audit alarm {alarm.pk} is not signed by the audit key")
            return
    # A chain still broken at later checkpoints keeps the alarm the first one raised.
    first_raised: dict[str, int] = {}
    for alarm in alarms:
        first_raised[alarm.chain] = min(
            alarm.checkpoint, first_raised.get(alarm.chain, alarm.checkpoint)
        )
    for checkpoint in checkpoints:
        for item in checkpoint.broken:
            chain = str(item["chain"])
            if chain not in first_raised or first_raised[chain] > checkpoint.number:
                yield ChainBreak(
                    "",
                    0,
                    f"checkpoint #{checkpoint.number} found chain {chain!r} broken, but its "
                    "alarm is missing (deleted)",
                )
                return
    resolved = [alarm.pk for alarm in alarms if alarm.resolved_at is not None]
    if resolved:
        on_record = {
            int(data.get("alarm", 0))
            for data in AuditEvent.objects.filter(
                operation_key=SYSTEM_CHAIN, kind=AuditKind.AUDIT_ALARM_RESOLVED
            ).values_list("data", flat=True)
        }
        for pk in resolved:
            if pk not in on_record:
                yield ChainBreak(
                    "", 0, f"audit alarm {pk} is marked resolved, but no one resolved it"
                )
                return


@dataclass(frozen=True)
class AuditStatus:
    """What the newest checkpoint covers, for the command and the console."""

    events: int
    chains: int
    checkpoint: AuditCheckpoint | None


def audit_status() -> AuditStatus:
    latest = AuditCheckpoint.objects.order_by("-number").first()
    events = AuditEvent.objects.count()
    chains = AuditEvent.objects.values("operation_key").distinct().count()
    return AuditStatus(events=events, chains=chains, checkpoint=latest)


def audit_verification_run(*, chunk_size: int = 5000) -> AuditVerification:
    """Verify the whole log (``audit_verify``) and keep the outcome, for the console.

    The record is written whether or not a problem was found: a broken log must show
    as broken, not as "last verified" at an earlier, intact moment.
    """
    started = timezone.now()
    tally = VerifyTally()
    problem = next(iter(audit_verify(chunk_size=chunk_size, tally=tally)), None)
    return AuditVerification.objects.create(
        at=started,
        ok=problem is None,
        problem="" if problem is None else str(problem),
        events_checked=tally.events,
    )
