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
import os
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
    AuditVerifyJob,
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
    first: int = 1  # the number of the first checkpoint checked
    file_offset: int = 0  # where the file was read to
    lines_read: int = 0


def _checkpoints_verified(
    *,
    chunk_size: int = 5000,
    after: int = 0,
    expected_prev: str = GENESIS_HASH,
    file_offset: int = 0,
    upto: int | None = None,
) -> tuple[Checkpointed, str | None]:
    """The checkpoints of the database, cross-checked with the file; or the problem.

    One checkpoint at a time, its heads streamed from the database in code point order
    and hashed as they come (``checkpoint_hashes_streamed``): a first checkpoint's heads
    name every chain of the log, and are never held together. A checkpoint with a
    non-ASCII chain is read and hashed whole. ``after``, ``expected_prev`` and
    ``file_offset``: start after checkpoint ``after``, verified already, whose digest is
    ``expected_prev`` and whose line ends at ``file_offset`` in the file; ``upto``: stop
    at that checkpoint (and at its line in the file). ``Checkpointed.file_offset`` is
    where the last checkpoint checked ends in the file.
    """
    found = Checkpointed(first=after + 1, file_offset=file_offset)
    stored = AuditCheckpoint.objects.order_by("number").defer("heads").filter(number__gt=after)
    if upto is not None:
        stored = stored.filter(number__lte=upto)
    first_prev = expected_prev
    for number, checkpoint in enumerate(stored.iterator(chunk_size=100), start=after + 1):
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
        if found.digests or after:
            return found, f"the checkpoint file {path} is missing"
        return found, None
    with path.open("rb") as lines:
        if file_offset > lines.seek(0, os.SEEK_END):
            return found, f"the checkpoint file {path} is shorter than when it was verified"
        lines.seek(file_offset)
        problem = _file_problem(lines, found, expected_prev=first_prev, upto=upto)
        found.file_offset = lines.tell()
    if problem is None and upto is not None and found.digests:
        newest = max(found.digests)
        if found.lines_read < newest - after:
            problem = (
                f"checkpoint #{after + found.lines_read + 1} is missing from the checkpoint file"
            )
    return found, problem


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


def _signed_heads(
    *, chunk_size: int, after: str | None = None, until: str | None = None
) -> Iterator[tuple[str, Signed]]:
    """Every head every checkpoint signed, a chain at a time, in the chains' order.

    The order is the events' ``ORDER BY operation_key`` (the database's collation, which
    a JSON key and the key column share), so that this stream and the events' are merged
    (``_SignedHeads``). From one server-side cursor; the sort is PostgreSQL's.
    """
    if connection.vendor == "postgresql":
        sql = (
            "SELECT h.key, h.value->>0, h.value->>1, c.number FROM recovery_auditcheckpoint c"
            " CROSS JOIN LATERAL jsonb_each(CASE jsonb_typeof(c.heads) WHEN 'object'"
            " THEN c.heads END) h{where} ORDER BY h.key, c.number"
        )
    else:
        sql = (
            "SELECT h.key, json_extract(h.value, '$[0]'), json_extract(h.value, '$[1]'),"
            " c.number FROM recovery_auditcheckpoint c, json_each(CASE json_type(c.heads)"
            " WHEN 'object' THEN c.heads END) h{where} ORDER BY h.key, c.number"
        )
    # A slice of the chains (``audit_verify_job_step``): the same bounds as its events'.
    conditions, params = [], []
    if after is not None:
        conditions.append("h.key > %s")
        params.append(after)
    if until is not None:
        conditions.append("h.key <= %s")
        params.append(until)
    sql = sql.format(where=" WHERE " + " AND ".join(conditions) if conditions else "")
    chain: str | None = None
    signed: list[tuple[int, str, int]] = []
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
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

    def __init__(
        self, *, chunk_size: int, after: str | None = None, until: str | None = None
    ) -> None:
        self._order = _ChainOrder()
        self._chains = _signed_heads(chunk_size=chunk_size, after=after, until=until)
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


def _file_problem(
    lines: BinaryIO,
    checkpointed: Checkpointed,
    *,
    expected_prev: str = GENESIS_HASH,
    upto: int | None = None,
) -> str | None:
    """The checkpoint file's first problem: a bad line, or a checkpoint the database lacks.

    Read a piece at a time. A line that is byte for byte the one its database checkpoint
    (already verified) makes is that checkpoint: it is hashed as read, not held, nor
    parsed again. Any other line is read whole and checked on its own. Read from where
    ``lines`` stands, the line of checkpoint ``checkpointed.first`` (whose predecessor's
    digest is ``expected_prev``); with ``upto``, not past that checkpoint's line.
    """
    by_number = checkpointed.digests
    line_number = checkpointed.first - 1
    while upto is None or line_number < upto:
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
        checkpointed.lines_read += 1
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
    return None


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


def _event_rows(
    *, chunk_size: int, after: tuple[str, int] = ("", 0), until: str | None = None
) -> Iterator[EventRow]:
    """Every event after (chain, seq) ``after``, in chain order, of the chains up to
    ``until`` (None: all): one statement per page."""
    sql = (
        f"SELECT {event_columns()} FROM recovery_auditevent"
        " WHERE (operation_key, seq) > (%s, %s)"
        + (" AND operation_key <= %s" if until is not None else "")
        + " ORDER BY operation_key, seq LIMIT %s"
    )
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*after, *([until] if until is not None else []), chunk_size])
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
    found = _chains_verified(after=None, until=None, chunk_size=chunk_size, tally=tally)
    if found is not None:
        yield found
        return
    yield from _rest_verified(checkpointed.broken, chunk_size=chunk_size)


def _rest_verified(broken: list[tuple[int, list[Any]]], *, chunk_size: int) -> Iterator[ChainBreak]:
    """After the chains: the system chain's stored head, the vouched heads, the alarms."""
    yield from _stored_heads_disagree()
    yield from _vouched_heads_disagree(chunk_size=chunk_size)
    yield from _alarms_disagree(broken)


# Above every seq: (chain, this) is after every event of the chain.
_AFTER_CHAIN = 2**63 - 1


def _chains_verified(
    *, after: str | None, until: str | None, chunk_size: int, tally: VerifyTally
) -> ChainBreak | None:
    """Every chain after ``after`` up to ``until`` (None: from the first, to the last),
    against its hashes, the checkpoints and its operation's stored head; the first problem.

    A slice (``after`` or ``until`` given) compares the operations with keys in the same
    range, so that consecutive slices compare each operation once.
    """
    signed_heads = _SignedHeads(chunk_size=chunk_size, after=after, until=until)
    # Chains a checkpoint signed that have no event: each one is a fault, so this stays
    # empty in an intact log.
    unseen: set[str] = set()
    missing: ChainBreak | None = None
    heads = _HeadsCompared(unseen)
    heads.after = after
    chain: str | None = None
    length = 0
    prev_hash = GENESIS_HASH
    signed: Signed = ()
    start = ("", 0) if after is None else (after, _AFTER_CHAIN)
    for row in _event_rows(chunk_size=chunk_size, after=start, until=until):
        tally.events += 1
        if row.chain != chain:
            if chain is not None:
                cut = _cut_problem(length, signed)
                if cut:
                    return ChainBreak(chain, length + 1, cut)
                found = heads.chain_read(chain, length, prev_hash, chunk_size=chunk_size)
                if found is not None:
                    return found
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
            return found
        for seq, signed_hash, number in signed:
            if seq == row.seq and signed_hash != row.hash:
                return ChainBreak(
                    chain, row.seq, f"differs from what checkpoint #{number} signed (rewritten)"
                )
        length, prev_hash = row.seq, row.hash
    if chain is not None:
        cut = _cut_problem(length, signed)
        if cut:
            return ChainBreak(chain, length + 1, cut)
        heads.ends[chain] = (length, prev_hash)
    for key, its_signed in signed_heads.upto(None):
        unseen.add(key)
        missing = missing or _missing_chain(key, its_signed)
    if missing is not None:
        return missing
    return heads.compare(upto=until, chunk_size=chunk_size)


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
        if alarm.kind != AuditAlarm.Kind.AUDIT_BROKEN:
            continue
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
    """Verify the whole log in one go (``audit_verify``) and keep the outcome.

    The record is written whether or not a problem was found: a broken log must show
    as broken, not as "last verified" at an earlier, intact moment. ``verify_audit``'s.
    """
    started = timezone.now()
    tally = tally if tally is not None else VerifyTally()
    newest = _newest_checkpoint_number()
    problem = next(iter(audit_verify(chunk_size=chunk_size, tally=tally)), None)
    return AuditVerification.objects.create(
        at=started,
        ok=problem is None,
        problem="" if problem is None else str(problem),
        events_checked=tally.events,
        scope=AuditVerification.Scope.FULL,
        checkpoint=newest if problem is None else 0,
        file_offset=_file_end_of(newest) if problem is None else 0,
        finished_at=timezone.now(),
    )


def _newest_checkpoint_number() -> int:
    number = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
    return int(number or 0)


def _file_end_of(number: int) -> int:
    """Where checkpoint ``number``'s line ends in the checkpoint file (0: not found)."""
    if number == 0:
        return 0
    checkpointed, problem = _checkpoints_verified(upto=number)
    return 0 if problem else checkpointed.file_offset


def audit_verified_through() -> AuditVerification | None:
    """The newest verification that found the log intact and covers a checkpoint."""
    return (
        AuditVerification.objects.filter(ok=True, checkpoint__gt=0)
        .order_by("-checkpoint", "-at", "-id")
        .first()
    )


def audit_verification_incremental(
    *, chunk_size: int = 5000, max_events: int | None = None
) -> AuditVerification | None:
    """The routine verification: what the checkpoints signed since the last verified one.

    The checkpoints after it (digest, signature, their chaining and their lines in the
    file, read from where the last verified line ended), and every event between the
    rescan point of the first and the watermark of the last, each against its
    predecessor and its own hash, in pages of ``chunk_size`` along the id; then what
    those checkpoints signed against the events, the system chain's stored head and
    the alarms they raised. Its cost follows what is new, not the log: the chains'
    older events, the operations' stored heads and the vouched heads are the full
    verification's (``audit_verify_job_step``). ``max_events`` bounds one run: it
    covers whole checkpoints up to about that many events and the next run goes on.
    With nothing verified yet it starts after the first checkpoint (the log that one
    signed is the full verification's). None when no checkpoint was ever signed.
    """
    from recovery.audit.checkpoints import _signers_serialised

    started = timezone.now()
    base = audit_verified_through()
    if base is None:
        first = AuditCheckpoint.objects.filter(number=1).only("digest").first()
        if first is None:
            return None
        checked, problem = _checkpoints_verified(chunk_size=chunk_size, upto=1)
        if problem:
            return _recorded(started, problem, 0, 0)
        after, expected_prev, offset = 1, first.digest, checked.file_offset
    else:
        stored = AuditCheckpoint.objects.filter(number=base.checkpoint).only("digest", "signature")
        row = stored.first()
        if row is None or not signed_by_key(row.digest, row.signature):
            return _recorded(started, f"checkpoint #{base.checkpoint} is gone or edited", 0, 0)
        after, expected_prev, offset = base.checkpoint, row.digest, base.file_offset
    newer = AuditCheckpoint.objects.filter(number__gt=after).order_by("number")
    marks = list(newer.values_list("number", "rescan_from", "watermark")[:1000])
    if not marks:  # nothing newly signed: still verified now, as far as it was
        return _recorded(started, "", 0, after, offset)
    upto, low, last_watermark = marks[0]
    for number, _, watermark in marks[1:]:
        # The checkpoints one backlog was signed in share their watermark: all or none.
        over = max_events is not None and watermark - low > max_events
        if over and watermark != last_watermark:
            break
        upto, last_watermark = number, watermark
    high = next(watermark for number, _, watermark in marks if number == upto)
    with _signers_serialised():  # a checkpoint signed and not yet in the file is not a gap
        checkpointed, problem = _checkpoints_verified(
            chunk_size=chunk_size,
            after=after,
            expected_prev=expected_prev,
            file_offset=offset,
            upto=upto,
        )
    if problem:
        return _recorded(started, problem, 0, 0)
    tally = VerifyTally()
    found = _events_linked(low, high, chunk_size=chunk_size, tally=tally)
    found = found or _signed_heads_hold(after, upto)
    if found is None:
        found = next(iter(_stored_heads_disagree()), None)
    if found is None:
        found = next(iter(_alarms_disagree(checkpointed.broken)), None)
    if found is not None:
        return _recorded(started, str(found), tally.events, 0)
    return _recorded(started, "", tally.events, upto, checkpointed.file_offset)


def _recorded(
    started: datetime, problem: str, events: int, checkpoint: int, file_offset: int = 0
) -> AuditVerification:
    return AuditVerification.objects.create(
        at=started,
        ok=not problem,
        problem=problem,
        events_checked=events,
        scope=AuditVerification.Scope.INCREMENTAL,
        checkpoint=checkpoint,
        file_offset=file_offset,
        finished_at=timezone.now(),
    )


def _events_linked(
    low: int, high: int, *, chunk_size: int, tally: VerifyTally
) -> ChainBreak | None:
    """Each event with an id in (``low``, ``high``] against its predecessor in its chain
    (read with it, along the (chain, seq) index) and its own hash: a page at a time."""
    columns = event_columns("e.")
    sql = (
        f"SELECT {columns}, p.hash, e.id FROM recovery_auditevent e LEFT JOIN"
        " recovery_auditevent p ON p.operation_key = e.operation_key AND p.seq = e.seq - 1"
        " WHERE e.id > %s AND e.id <= %s ORDER BY e.id LIMIT %s"
    )
    after = low
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [after, high, chunk_size])
            page = cursor.fetchall()
        for fetched, row in zip(page, event_rows([item[:-2] for item in page]), strict=True):
            tally.events += 1
            predecessor = fetched[-2]
            if row.seq > 1 and predecessor is None:
                return ChainBreak(row.chain, row.seq - 1, "this event is missing (deleted)")
            prev_hash = GENESIS_HASH if row.seq == 1 else str(predecessor)
            found = event_row_break(row, seq=row.seq, prev_hash=prev_hash)
            if found is not None:
                return found
        if len(page) < chunk_size:
            return None
        after = int(page[-1][-1])


def _signed_heads_hold(after: int, upto: int) -> ChainBreak | None:
    """Every head checkpoints ``after`` + 1 … ``upto`` signed is its chain's event: one
    statement, the database joining their heads to the events."""
    if connection.vendor == "postgresql":
        heads = (
            "SELECT c.number, h.key, (h.value->>0)::bigint AS seq, h.value->>1 AS hash"
            " FROM recovery_auditcheckpoint c CROSS JOIN LATERAL jsonb_each(CASE"
            " jsonb_typeof(c.heads) WHEN 'object' THEN c.heads END) h"
            " WHERE c.number > %s AND c.number <= %s"
        )
    else:
        heads = (
            "SELECT c.number, h.key, json_extract(h.value, '$[0]') AS seq,"
            " json_extract(h.value, '$[1]') AS hash FROM recovery_auditcheckpoint c,"
            " json_each(CASE json_type(c.heads) WHEN 'object' THEN c.heads END) h"
            " WHERE c.number > %s AND c.number <= %s"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.number, s.key, s.seq, e.hash FROM ({heads}) s LEFT JOIN"
            " recovery_auditevent e ON e.operation_key = s.key AND e.seq = s.seq"
            " WHERE e.hash IS NULL OR e.hash <> s.hash ORDER BY s.number, s.key LIMIT 1",
            [after, upto],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    number, chain, seq, found = row
    if found is None:
        return ChainBreak(str(chain), int(seq), f"checkpoint #{number} signed it; it is missing")
    return ChainBreak(
        str(chain), int(seq), f"differs from what checkpoint #{number} signed (rewritten)"
    )


def audit_verify_job_step(
    *, slice_events: int, chunk_size: int = 5000, restart_after_seconds: float | None = None
) -> AuditVerifyJob | None:
    """One slice of the full verification job: the checkpoints, or the next
    ``slice_events`` or so events (whole chains), or the last checks; progress kept.

    A job is started when none is running and the last one started more than
    ``restart_after_seconds`` ago (None: never again once one finished). When the job
    finishes, or finds a problem, its outcome is an ``AuditVerification`` of scope
    ``full``. None when there is nothing to do.
    """
    job = AuditVerifyJob.objects.exclude(phase=AuditVerifyJob.Phase.DONE).first()
    now = timezone.now()
    if job is None:
        last = AuditVerifyJob.objects.order_by("-started_at", "-id").first()
        if last is not None and (
            restart_after_seconds is None
            or (now - last.started_at).total_seconds() < restart_after_seconds
        ):
            return None
        job = AuditVerifyJob.objects.create(started_at=now, updated_at=now)
    job.slices += 1
    problem: str | None = None
    if job.phase == AuditVerifyJob.Phase.CHECKPOINTS:
        newest = _newest_checkpoint_number()
        checkpointed, problem = _checkpoints_verified(chunk_size=chunk_size, upto=newest or None)
        job.checkpoint = newest
        job.file_offset = checkpointed.file_offset
        job.phase = AuditVerifyJob.Phase.CHAINS
    elif job.phase == AuditVerifyJob.Phase.CHAINS:
        until = _slice_end(job.after_chain, slice_events)
        tally = VerifyTally()
        found = _chains_verified(
            after=job.after_chain, until=until, chunk_size=chunk_size, tally=tally
        )
        job.events_checked += tally.events
        job.chains_checked += tally.chains
        job.after_chain = until
        if until is None:
            job.phase = AuditVerifyJob.Phase.FINISH
        problem = None if found is None else str(found)
    else:
        broken = list(
            AuditCheckpoint.objects.filter(number__lte=job.checkpoint)
            .order_by("number")
            .values_list("number", "broken")
        )
        found = next(iter(_rest_verified(broken, chunk_size=chunk_size)), None)
        problem = None if found is None else str(found)
        job.phase = AuditVerifyJob.Phase.DONE
    job.updated_at = timezone.now()
    if problem is not None or job.phase == AuditVerifyJob.Phase.DONE:
        job.phase = AuditVerifyJob.Phase.DONE
        job.verification = AuditVerification.objects.create(
            at=job.started_at,
            ok=problem is None,
            problem=problem or "",
            events_checked=job.events_checked,
            scope=AuditVerification.Scope.FULL,
            checkpoint=job.checkpoint if problem is None else 0,
            file_offset=job.file_offset if problem is None else 0,
            finished_at=job.updated_at,
        )
    job.save()
    return job


def _slice_end(after: str | None, events: int) -> str | None:
    """The chain at which a slice of about ``events`` events after chain ``after`` ends
    (whole chains); None: the slice runs to the last chain."""
    start = ("", 0) if after is None else (after, _AFTER_CHAIN)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT operation_key FROM recovery_auditevent WHERE (operation_key, seq) > (%s, %s)"
            " ORDER BY operation_key, seq LIMIT 1 OFFSET %s",
            [*start, max(0, events - 1)],
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])
