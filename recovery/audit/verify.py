"""Verifying the whole audit log: every chain, every checkpoint, the file outside.

``audit_verify`` reads every event once, in chain order, and checks it against its
predecessor, its own hash and every checkpoint that signed its seq — not only the
newest, so that a head signed again after a rewrite cannot hide what was signed
before; each operation's stored head is compared with its chain as the chains are read
(``_HeadsCompared``). Then the system chain's stored head, the vouched heads and the
alarms. It names the first problem found.

The events are read as column tuples (``EventRow``), a page of ``chunk_size`` at a time
along the (chain, seq) index, each page starting after the last (chain, seq) read: no
cursor stays open between pages, memory holds one page, and a verification could
resume from (or be split at) any chain. What the checkpoints signed is read the same
way round, never indexed: every (chain, head, checkpoint) of every checkpoint's
``heads``, expanded and sorted by the database in the events' chain order
(``_signed_heads``, one server-side cursor), merged with the events (a signed chain
with no event is found by the merge) and, after them, with the vouched heads. A
checkpoint's digest and its file line are hashed with its heads streamed
(``checkpoint_hashes_streamed``). Memory holds a page and one chain, whatever the
number of chains.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone

from recovery.audit.alarms import alarm_signed
from recovery.audit.chain import (
    _TIMESTAMP,
    GENESIS_HASH,
    SYSTEM_CHAIN,
    ChainBreak,
    EventRow,
    event_columns,
    event_row_break,
    event_rows,
)
from recovery.audit.checkpoints import (
    checkpoint_digest,
    checkpoint_file_line,
    checkpoint_hashes_streamed,
    vouched_row_signed,
)
from recovery.audit.keys import signed_by_key
from recovery.canonical import plain_loads
from recovery.models import (
    AuditAlarm,
    AuditChainHead,
    AuditCheckpoint,
    AuditEvent,
    AuditVerification,
    AuditVouchedHead,
)
from recovery.vocabulary import AuditKind


def _checkpoint_problem(
    checkpoint: AuditCheckpoint,
    expected_prev: str,
    *,
    heads_plain: bool = False,
    digest: str | None = None,
) -> str | None:
    """``digest``: the checkpoint's, computed already (``checkpoint_hashes_streamed``)."""
    if checkpoint.prev_digest != expected_prev:
        return f"checkpoint #{checkpoint.number} does not follow its predecessor"
    if digest is None:
        digest = checkpoint_digest(checkpoint, heads_plain=heads_plain)
    if digest != checkpoint.digest:
        return f"checkpoint #{checkpoint.number} was edited (its digest does not match)"
    if not signed_by_key(checkpoint.digest, checkpoint.signature):
        return f"checkpoint #{checkpoint.number} is not signed by the audit key"
    return None


# (seq, hash, checkpoint number), … in checkpoint order: every head the checkpoints
# signed for one chain.
Signed = tuple[tuple[int, str, int], ...]


@dataclass
class Checkpointed:
    """What the verified checkpoints vouch for, kept once each checkpoint is let go.

    One entry per checkpoint, none per chain: the heads they signed are read again, in
    chain order, where they are compared (``_signed_heads``).
    """

    # (number, broken) of every checkpoint, in order.
    broken: list[tuple[int, list[Any]]] = field(default_factory=list)
    digests: dict[int, str] = field(default_factory=dict)
    # The sha256 of each checkpoint's line as the checkpoint file holds it.
    lines: dict[int, bytes] = field(default_factory=dict)


def _checkpoints_verified(*, chunk_size: int = 5000) -> tuple[Checkpointed, str | None]:
    """The checkpoints of the database, cross-checked with the file; or the problem.

    One checkpoint at a time, its heads streamed from the database in code point order
    and hashed as they come (``checkpoint_hashes_streamed``): a first checkpoint's heads
    name every chain of the log, and are never held together. A checkpoint with a
    non-ASCII chain is read and hashed whole.
    """
    found = Checkpointed()
    stored = AuditCheckpoint.objects.order_by("number").defer("heads")
    expected_prev = GENESIS_HASH
    for number, checkpoint in enumerate(stored.iterator(chunk_size=100), start=1):
        if checkpoint.number != number:
            return found, f"checkpoint #{number} is missing from the database"
        try:
            hashes = checkpoint_hashes_streamed(
                checkpoint, _heads_in_code_point_order(number, chunk_size=chunk_size)
            )
        except _NotAnObject:
            hashes = None
        if hashes is None:
            text = (
                AuditCheckpoint.objects.filter(number=number)
                .annotate(heads_text=Cast("heads", TextField()))
                .values_list("heads_text", flat=True)
                .get()
            )
            checkpoint.heads, heads_plain = plain_loads(text)
            hashes = (
                checkpoint_digest(checkpoint, heads_plain=heads_plain),
                _line_sha(checkpoint_file_line(checkpoint)),
            )
            del checkpoint.heads
        digest, line_sha = hashes
        problem = _checkpoint_problem(checkpoint, expected_prev, digest=digest)
        if problem:
            return found, problem
        expected_prev = checkpoint.digest
        found.broken.append((checkpoint.number, checkpoint.broken))
        found.digests[checkpoint.number] = checkpoint.digest
        found.lines[checkpoint.number] = line_sha
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    if not path.exists():
        if found.digests:
            return found, f"the checkpoint file {path} is missing"
        return found, None
    with path.open("rb") as lines:
        return found, _file_problem(lines, found)


class _NotAnObject(Exception):
    """A checkpoint's ``heads`` is not a JSON object (edited): it is checked whole."""


def _heads_in_code_point_order(number: int, *, chunk_size: int) -> Iterator[tuple[str, str]]:
    """(chain, its head's JSON text) of checkpoint ``number``, in code point order (bytes
    of UTF-8), from one server-side cursor. A first row without a key: ``heads`` is not
    an object."""
    if connection.vendor == "postgresql":
        sql = (
            "SELECT key, value FROM (SELECT h.key, h.value::text FROM recovery_auditcheckpoint"
            " c CROSS JOIN LATERAL jsonb_each(CASE jsonb_typeof(c.heads) WHEN 'object' THEN"
            " c.heads END) h WHERE c.number = %s UNION ALL SELECT NULL::text, NULL::text"
            " FROM recovery_auditcheckpoint WHERE number = %s AND jsonb_typeof(heads) <>"
            " 'object') heads ORDER BY key COLLATE \"C\" NULLS FIRST"
        )
    else:  # SQLite: json_each's key sorts BINARY, the bytes of UTF-8; NULL first
        sql = (
            "SELECT h.key, h.value FROM recovery_auditcheckpoint c, json_each(CASE"
            " json_type(c.heads) WHEN 'object' THEN c.heads END) h WHERE c.number = %s"
            " UNION ALL SELECT NULL, NULL FROM recovery_auditcheckpoint WHERE number = %s"
            " AND json_type(heads) <> 'object' ORDER BY 1"
        )
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [number, number])
        while page := cursor.fetchmany(chunk_size):
            for key, value in page:
                if key is None:
                    raise _NotAnObject
                yield str(key), str(value)


def _signed_heads(*, chunk_size: int) -> Iterator[tuple[str, Signed]]:
    """Every head every checkpoint signed, a chain at a time, in the chains' order.

    The order is the events' ``ORDER BY operation_key`` (the database's collation, which
    a JSON key and the key column share), so that this stream and the events' are merged
    (``_SignedHeads``). From one server-side cursor; the sort is PostgreSQL's.
    """
    if connection.vendor == "postgresql":
        sql = (
            "SELECT h.key, h.value->>0, h.value->>1, c.number FROM recovery_auditcheckpoint c"
            " CROSS JOIN LATERAL jsonb_each(CASE jsonb_typeof(c.heads) WHEN 'object'"
            " THEN c.heads END) h ORDER BY h.key, c.number"
        )
    else:
        sql = (
            "SELECT h.key, json_extract(h.value, '$[0]'), json_extract(h.value, '$[1]'),"
            " c.number FROM recovery_auditcheckpoint c, json_each(CASE json_type(c.heads)"
            " WHEN 'object' THEN c.heads END) h ORDER BY h.key, c.number"
        )
    chain: str | None = None
    signed: list[tuple[int, str, int]] = []
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql)
        while page := cursor.fetchmany(chunk_size):
            for key, seq, digest, number in page:
                if key != chain:
                    if chain is not None:
                        yield chain, tuple(signed)
                    chain, signed = str(key), []
                signed.append((int(seq), str(digest), int(number)))
    if chain is not None:
        yield chain, tuple(signed)


# libc collations that sort by code point (the bytes of UTF-8), as Python compares.
_CODE_POINT_COLLATIONS = ("C", "POSIX", "C.UTF-8", "C.utf8")


class _ChainOrder:
    """Whether one chain comes before another in the events' ``ORDER BY operation_key``.

    Python's order where the database's is code point order (SQLite's BINARY,
    PostgreSQL's "C", "POSIX" and "C.UTF-8" collations); otherwise PostgreSQL is asked.
    """

    def __init__(self) -> None:
        self.code_points = True
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # datlocprovider ('c': libc, 'i': ICU) is PostgreSQL 15's.
                cursor.execute(
                    "SELECT datcollate, to_jsonb(d) ->> 'datlocprovider' FROM pg_database d"
                    " WHERE datname = current_database()"
                )
                collate, provider = cursor.fetchone()
                self.code_points = provider in (None, "c") and collate in _CODE_POINT_COLLATIONS

    def before(self, one: str, other: str) -> bool:
        if self.code_points:
            return one < other
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::varchar < %s::varchar", [one, other])
            return bool(cursor.fetchone()[0])


class _SignedHeads:
    """``_signed_heads`` read along with another stream in the same chain order."""

    def __init__(self, *, chunk_size: int) -> None:
        self._order = _ChainOrder()
        self._chains = _signed_heads(chunk_size=chunk_size)
        self._next = next(self._chains, None)

    def upto(self, chain: str | None) -> Iterator[tuple[str, Signed]]:
        """The chains not read yet up to ``chain`` included (None: all that are left)."""
        while self._next is not None and (
            chain is None or self._next[0] == chain or self._order.before(self._next[0], chain)
        ):
            yield self._next
            self._next = next(self._chains, None)


def _line_sha(line: str) -> bytes:
    return hashlib.sha256(line.encode("utf-8")).digest()


# The checkpoint file is read this many bytes at a time: a line (a first checkpoint's
# names every chain) is hashed in pieces, not held.
_FILE_PIECE = 1 << 20


def _file_problem(lines: BinaryIO, checkpointed: Checkpointed) -> str | None:
    """The checkpoint file's first problem: a bad line, or a checkpoint the database lacks.

    Read a piece at a time. A line that is byte for byte the one its database checkpoint
    (already verified) makes is that checkpoint: it is hashed as read, not held, nor
    parsed again. Any other line is read whole and checked on its own.
    """
    by_number = checkpointed.digests
    expected_prev = GENESIS_HASH
    line_number = 0
    while True:
        start = lines.tell()
        piece = lines.readline(_FILE_PIECE)
        if not piece:
            return None
        line_number += 1
        sha = hashlib.sha256()
        while not piece.endswith(b"\n"):
            sha.update(piece)
            piece = lines.readline(_FILE_PIECE)
            if not piece:
                break
        sha.update(piece.removesuffix(b"\n"))
        if sha.digest() == checkpointed.lines.get(line_number):
            expected_prev = by_number[line_number]
            continue
        end = lines.tell()
        lines.seek(start)
        whole = lines.read(end - start)
        try:
            record, plain = plain_loads(whole.decode("utf-8"))
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
            return f"line {line_number} of the checkpoint file is unreadable"
        del whole, record
        problem = _checkpoint_problem(checkpoint, expected_prev, heads_plain=plain)
        if problem:
            return f"{problem} (checkpoint file, line {line_number})"
        expected_prev = checkpoint.digest
        in_database = by_number.get(checkpoint.number)
        if in_database is None:
            return (
                f"checkpoint #{checkpoint.number} of the checkpoint file is missing from "
                "the database"
            )
        if in_database != checkpoint.digest:
            return f"checkpoint #{checkpoint.number} differs from the checkpoint file"


def _newest(signed: Signed) -> tuple[int, str, int]:
    """A chain's newest signed head: the highest seq, by the latest checkpoint to sign it."""
    return max(signed, key=lambda entry: (entry[0], entry[2]))


def _cut_problem(length: int, signed: Signed | None) -> str | None:
    """Events a checkpoint signed beyond the chain's ``length``: cut from its tail."""
    if not signed:
        return None
    seq, _, number = _newest(signed)
    if seq <= length:
        return None
    if length == 0:
        return f"every event of this chain is missing; checkpoint #{number} names {seq}"
    return f"events after #{length} are missing; checkpoint #{number} names #{seq} (cut)"


@dataclass
class VerifyTally:
    """How far a verification got: the events whose hashes it checked, and their chains."""

    events: int = 0
    chains: int = 0


def _event_rows(*, chunk_size: int, after: tuple[str, int] = ("", 0)) -> Iterator[EventRow]:
    """Every event after (chain, seq) ``after``, in chain order: one statement per page."""
    sql = (
        f"SELECT {event_columns()} FROM recovery_auditevent"
        " WHERE (operation_key, seq) > (%s, %s) ORDER BY operation_key, seq LIMIT %s"
    )
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*after, chunk_size])
            page = cursor.fetchall()
        yield from event_rows(page)
        if len(page) < chunk_size:
            return
        after = (page[-1][0], page[-1][1])


def audit_verify(
    *, chunk_size: int = 5000, tally: VerifyTally | None = None
) -> Iterator[ChainBreak]:
    """Check every checkpoint and every chain; yield the first problem found (if any)."""
    tally = tally if tally is not None else VerifyTally()
    checkpointed, problem = _checkpoints_verified(chunk_size=chunk_size)
    if problem:
        yield ChainBreak("", 0, problem)
        return
    signed_heads = _SignedHeads(chunk_size=chunk_size)
    # Chains a checkpoint signed that have no event: each one is a fault, so this stays
    # empty in an intact log.
    unseen: set[str] = set()
    missing: ChainBreak | None = None
    heads = _HeadsCompared(unseen)
    chain: str | None = None
    length = 0
    prev_hash = GENESIS_HASH
    signed: Signed = ()
    for row in _event_rows(chunk_size=chunk_size):
        tally.events += 1
        if row.chain != chain:
            if chain is not None:
                cut = _cut_problem(length, signed)
                if cut:
                    yield ChainBreak(chain, length + 1, cut)
                    return
                found = heads.chain_read(chain, length, prev_hash, chunk_size=chunk_size)
                if found is not None:
                    yield found
                    return
            chain, length, prev_hash = row.chain, 0, GENESIS_HASH
            tally.chains += 1
            signed = ()
            for key, its_signed in signed_heads.upto(chain):
                if key == chain:
                    signed = its_signed
                else:
                    unseen.add(key)
                    missing = missing or _missing_chain(key, its_signed)
        found = event_row_break(row, seq=length + 1, prev_hash=prev_hash)
        if found is not None:
            yield found
            return
        for seq, signed_hash, number in signed:
            if seq == row.seq and signed_hash != row.hash:
                yield ChainBreak(
                    chain, row.seq, f"differs from what checkpoint #{number} signed (rewritten)"
                )
                return
        length, prev_hash = row.seq, row.hash
    if chain is not None:
        cut = _cut_problem(length, signed)
        if cut:
            yield ChainBreak(chain, length + 1, cut)
            return
        heads.ends[chain] = (length, prev_hash)
    for key, its_signed in signed_heads.upto(None):
        unseen.add(key)
        missing = missing or _missing_chain(key, its_signed)
    if missing is not None:
        yield missing
        return
    found = heads.compare(upto=None, chunk_size=chunk_size)
    if found is not None:
        yield found
        return
    yield from _stored_heads_disagree()
    yield from _vouched_heads_disagree(chunk_size=chunk_size)
    yield from _alarms_disagree(checkpointed.broken)


def _missing_chain(chain: str, signed: Signed) -> ChainBreak | None:
    """A chain the checkpoints signed and that has no event."""
    cut = _cut_problem(0, signed)
    return ChainBreak(chain, 1, cut) if cut else None


class _HeadsCompared:
    """Each operation's stored head (``audit_seq``, ``audit_hash``) against its chain as read.

    Catches a cut or rewrite of the newest events that left the stored head alone, even
    where no checkpoint covers them yet. The operations are read along their key, in
    ranges that follow the chains already read (the same column type and collation as
    the events' order): no lookup per operation, and no more than a page in memory.
    An operation whose chain has no event is compared with an empty chain; one whose
    chain a checkpoint signed and that has no event is left to the cut check, which
    names it.
    """

    def __init__(self, unseen: set[str]) -> None:
        self.ends: dict[str, tuple[int, str]] = {}  # chains read since the last compare
        self.after: str | None = None  # operations up to this key are compared
        self.unseen = unseen

    def chain_read(
        self, chain: str, length: int, last_hash: str, *, chunk_size: int
    ) -> ChainBreak | None:
        self.ends[chain] = (length, last_hash)
        if len(self.ends) < chunk_size:
            return None
        return self.compare(upto=chain, chunk_size=chunk_size)

    def compare(self, *, upto: str | None, chunk_size: int) -> ChainBreak | None:
        """Compare the operations with keys after ``self.after`` and up to ``upto``."""
        for key, seq, digest in _operation_heads(self.after, upto, chunk_size=chunk_size):
            if key in self.unseen:
                continue
            length, last_hash = self.ends.get(key, (0, GENESIS_HASH))
            if seq != length or (seq > 0 and digest != last_hash):
                return ChainBreak(
                    key, seq, "the operation's row names a different head for its chain"
                )
        self.ends.clear()
        self.after = upto
        return None


def _operation_heads(
    after: str | None, upto: str | None, *, chunk_size: int
) -> Iterator[tuple[str, int, str]]:
    """(key, audit_seq, audit_hash) of the operations with keys in (``after``, ``upto``]."""
    while True:
        where = []
        params: list[Any] = []
        if after is not None:
            where.append("key > %s")
            params.append(after)
        if upto is not None:
            where.append("key <= %s")
            params.append(upto)
        sql = "SELECT key, audit_seq, audit_hash FROM recovery_operation"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with connection.cursor() as cursor:
            cursor.execute(sql + " ORDER BY key LIMIT %s", [*params, chunk_size])
            page = cursor.fetchall()
        for key, seq, digest in page:
            yield str(key), int(seq), str(digest)
        if len(page) < chunk_size:
            return
        after = page[-1][0]


def _stored_heads_disagree() -> Iterator[ChainBreak]:
    """The system chain's stored head (``AuditChainHead``) must be its last event.

    The operations' stored heads are compared as their chains are read (``_HeadsCompared``).
    """
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


def _vouched_heads_disagree(*, chunk_size: int) -> Iterator[ChainBreak]:
    """Vouched heads must be signed and be each chain's newest signed head, no other.

    The vouched heads (one row per chain, unique) and what the checkpoints signed are
    read side by side in chain order; a signed chain without a row is named last, as
    the first such chain.
    """
    signed_heads = _SignedHeads(chunk_size=chunk_size)
    missing: str | None = None
    rows = AuditVouchedHead.objects.order_by("chain").values_list(
        "chain", "seq", "hash", "checkpoint", "signature"
    )
    for chain, seq, digest, number, signature in rows.iterator(chunk_size=chunk_size):
        signed: Signed = ()
        for key, its_signed in signed_heads.upto(chain):
            if key == chain:
                signed = its_signed
            elif missing is None:
                missing = key
        if not vouched_row_signed(
            chain=chain, seq=seq, hash=digest, checkpoint=number, signature=signature
        ):
            yield ChainBreak(chain, seq, "its vouched head is not signed by the audit key")
            return
        if not signed or _newest(signed) != (seq, digest, number):
            yield ChainBreak(
                chain,
                seq,
                "its vouched head is not the newest head the checkpoints signed (rolled back)",
            )
            return
    for key, _ in signed_heads.upto(None):
        missing = missing if missing is not None else key
    if missing is not None:
        yield ChainBreak(missing, 0, "its vouched head is missing (deleted)")


def _alarms_disagree(found_broken: list[tuple[int, list[Any]]]) -> Iterator[ChainBreak]:
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
    for number, broken in found_broken:
        for item in broken:
            chain = str(item["chain"])
            if chain not in first_raised or first_raised[chain] > number:
                yield ChainBreak(
                    "",
                    0,
                    f"checkpoint #{number} found chain {chain!r} broken, but its "
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


def audit_checkpoint_newest() -> AuditCheckpoint | None:
    """The newest checkpoint, without its heads (a first checkpoint's name every chain)."""
    return AuditCheckpoint.objects.defer("heads", "broken").order_by("-number").first()


def audit_status() -> AuditStatus:
    latest = audit_checkpoint_newest()
    events = AuditEvent.objects.count()
    chains = AuditEvent.objects.values("operation_key").distinct().count()
    return AuditStatus(events=events, chains=chains, checkpoint=latest)


def audit_verification_run(
    *, chunk_size: int = 5000, tally: VerifyTally | None = None
) -> AuditVerification:
    """Verify the whole log (``audit_verify``) and keep the outcome, for the console.

    The record is written whether or not a problem was found: a broken log must show
    as broken, not as "last verified" at an earlier, intact moment.
    """
    started = timezone.now()
    tally = tally if tally is not None else VerifyTally()
    problem = next(iter(audit_verify(chunk_size=chunk_size, tally=tally)), None)
    return AuditVerification.objects.create(
        at=started,
        ok=problem is None,
        problem="" if problem is None else str(problem),
        events_checked=tally.events,
    )
