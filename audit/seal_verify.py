"""Checking the log's seal (``audit.seal``), as a verification reads it: the checkpoints
the audit key signed, the heads they signed, and the checkpoint file.

Every (chain, head, checkpoint) of every checkpoint's ``heads`` is expanded and sorted by
the database in the events' chain order (``_signed_heads``, one server-side cursor), so
that a verification merges it with the events instead of indexing it; the checkpoints
themselves and the checkpoint file (read in pieces) are checked against their digests,
signatures and each other.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast

from audit.hashing import GENESIS_HASH
from audit.models import AuditCheckpoint
from audit.seal import (
    checkpoint_digest,
    checkpoint_file_line,
    checkpoint_hashes_streamed,
    checkpoint_of_line,
    signed_by_key,
)
from common.canonical import plain_loads


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
            "SELECT key, value FROM (SELECT h.key, h.value::text FROM audit_auditcheckpoint"
            " c CROSS JOIN LATERAL jsonb_each(CASE jsonb_typeof(c.heads) WHEN 'object' THEN"
            " c.heads END) h WHERE c.number = %s UNION ALL SELECT NULL::text, NULL::text"
            " FROM audit_auditcheckpoint WHERE number = %s AND jsonb_typeof(heads) <>"
            " 'object') heads ORDER BY key COLLATE \"C\" NULLS FIRST"
        )
    else:  # SQLite: json_each's key sorts BINARY, the bytes of UTF-8; NULL first
        sql = (
            "SELECT h.key, h.value FROM audit_auditcheckpoint c, json_each(CASE"
            " json_type(c.heads) WHEN 'object' THEN c.heads END) h WHERE c.number = %s"
            " UNION ALL SELECT NULL, NULL FROM audit_auditcheckpoint WHERE number = %s"
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
            "SELECT h.key, h.value->>0, h.value->>1, c.number FROM audit_auditcheckpoint c"
            " CROSS JOIN LATERAL jsonb_each(CASE jsonb_typeof(c.heads) WHEN 'object'"
            " THEN c.heads END) h{where} ORDER BY h.key, c.number"
        )
    else:
        sql = (
            "SELECT h.key, json_extract(h.value, '$[0]'), json_extract(h.value, '$[1]'),"
            " c.number FROM audit_auditcheckpoint c, json_each(CASE json_type(c.heads)"
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
            checkpoint, plain = checkpoint_of_line(whole.decode("utf-8"))
        except (ValueError, KeyError, TypeError):
            return f"line {line_number} of the checkpoint file is unreadable"
        del whole
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
