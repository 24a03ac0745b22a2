"""Signed checkpoints: each one extends what the ones before it vouched for, never replaces it.

checkpoint
    An HMAC-signed statement (``AuditCheckpoint``) of the heads of the chains that moved
    since an earlier checkpoint, under the audit key, which is not in the database; also
    appended to a file outside it. Checkpoints are chained (``prev_digest``).
vouched head
    The newest head a checkpoint signed for a chain (``AuditVouchedHead``), itself
    signed, so that the next checkpoint reads one row per chain that moved, not every
    checkpoint before it.
extension
    Before it signs a chain's new head, a checkpoint proves that the chain still holds
    the vouched hash at the vouched seq and that every event since links onto it and
    matches its own hash. It reads only those events: its cost grows with what is new,
    not with the log.
broken
    A chain that does not extend its vouched head (rewritten, cut, re-inserted, or with
    a forged vouched head) is not signed. The checkpoint names it in its own signed
    ``broken`` list, raises an ``audit_broken`` alarm (``recovery.audit.alarms``) and
    logs it at ERROR; it goes on signing the chains that hold.
window
    Events newer than the newest checkpoint are protected by their chains and their
    chain's stored head only (the operation's row, the system chain's
    ``AuditChainHead``): someone with SQL access who rewrites such events and moves the
    head to match goes unnoticed until the next checkpoint, which then finds no fault
    in them. Everything a checkpoint signed stays checked, by every later checkpoint
    for the chains that move and by ``verify_audit`` for all.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from recovery.audit.alarms import (
    audit_alarms_raise,
    audit_file_alarm_clear,
    audit_file_alarm_raise,
)
from recovery.audit.chain import (
    GENESIS_HASH,
    ChainBreak,
    EventRow,
    event_columns,
    event_row_break,
    event_rows,
    timestamp,
)
from recovery.audit.keys import sign, signed_by_key
from recovery.canonical import (
    canonical_dumps,
    canonical_plain,
    canonical_plain_dumps,
    safe_integer,
    sha256_digest,
)
from recovery.models import AuditCheckpoint, AuditEvent, AuditVouchedHead

logger = logging.getLogger("settle.audit")

# Advisory lock key (PostgreSQL): one checkpoint is made at a time.
_CHECKPOINT_LOCK = 0x5E771E02
# A checkpoint scans again the events of this long before its predecessor, so that an
# event whose transaction committed after that predecessor was made is still covered.
CHECKPOINT_RESCAN = timedelta(minutes=2)
# Chains read in one statement (their vouched heads, their new events).
_BATCH = 500


def advisory_xact_lock(*keys: int) -> None:
    """Take a PostgreSQL advisory lock until this transaction ends.

    On SQLite writers are serialised already (``BEGIN IMMEDIATE``): nothing to take.
    """
    if connection.vendor == "postgresql":
        placeholders = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({placeholders})", list(keys))


def checkpoint_content(checkpoint: AuditCheckpoint) -> dict[str, Any]:
    return _content(checkpoint, checkpoint.heads)


def _content(checkpoint: AuditCheckpoint, heads: Any) -> dict[str, Any]:
    content: dict[str, Any] = {
        "number": checkpoint.number,
        "made_at": timestamp(checkpoint.made_at),
        "rescan_from": checkpoint.rescan_from,
        "watermark": checkpoint.watermark,
        "heads": heads,
        "prev_digest": checkpoint.prev_digest,
    }
    if checkpoint.broken:  # absent from checkpoints that found nothing, as before it existed
        content["broken"] = checkpoint.broken
    return content


def checkpoint_digest(checkpoint: AuditCheckpoint, *, heads_plain: bool = False) -> str:
    """The digest a checkpoint signs; ``heads_plain``: its heads are known plain JSON
    (``plain_loads``), so the one large part of it is not walked again."""
    content = checkpoint_content(checkpoint)
    if heads_plain and canonical_plain({**content, "heads": {}}):
        return sha256_digest(canonical_plain_dumps(content))
    return sha256_digest(canonical_dumps(content))


# A head as PostgreSQL (``jsonb::text``) or SQLite (``json_each``) spells it: a safe
# integer and a printable ASCII text without quote or backslash, which canonical JSON and
# ``json.dumps`` write the same, verbatim.
_PLAIN_HEAD = re.compile(r'\[(0|[1-9][0-9]{0,15}), ?"([ !#-\[\]-~]*)"\]')
_PLAIN_KEY = re.compile(r"[ !#-\[\]-~]*")


def _head_pieces(key: str, value_text: str) -> tuple[bytes, bytes]:
    """One head's canonical bytes (``"key":value``) and its file line's (``"key": value``)."""
    plain = _PLAIN_HEAD.fullmatch(value_text)
    if plain is not None and _PLAIN_KEY.fullmatch(key) and safe_integer(int(plain[1])):
        canonical = f'"{key}":[{plain[1]},"{plain[2]}"]'
        return canonical.encode("ascii"), f'"{key}": [{plain[1]}, "{plain[2]}"]'.encode("ascii")
    value = json.loads(value_text)
    canonical_key = canonical_dumps(key)
    return (
        canonical_key + b":" + canonical_dumps(value),
        (json.dumps(key) + ": " + json.dumps(value, sort_keys=True)).encode("ascii"),
    )


def checkpoint_hashes_streamed(
    checkpoint: AuditCheckpoint, heads: Iterable[tuple[str, str]]
) -> tuple[str, bytes] | None:
    """``checkpoint_digest`` and the sha256 of ``checkpoint_file_line``, the heads hashed
    one at a time as they come, never held together.

    ``heads``: (chain, the JSON text of its head) in code point order. Only for ASCII
    chains (an operation key is ASCII; the system chain is ""), where code point order is
    RFC 8785's order (UTF-16 code units) and ``json.dumps``'s: None at the first other
    one, and the caller hashes the checkpoint whole (``checkpoint_digest``).
    """
    # The content around the heads: texts that JSON escapes inside strings cannot hold
    # '"heads":{}' unescaped, so its first occurrence is the key itself.
    around = canonical_dumps(_content(checkpoint, {})).split(b'"heads":{}', 1)
    line = {**_content(checkpoint, {}), "digest": checkpoint.digest}
    line["signature"] = checkpoint.signature
    line_around = json.dumps(line, sort_keys=True).encode("ascii").split(b'"heads": {}', 1)
    digest = hashlib.sha256(around[0] + b'"heads":{')
    line_sha = hashlib.sha256(line_around[0] + b'"heads": {')
    first = True
    for key, value_text in heads:
        if not key.isascii():
            return None
        canonical, spelled = _head_pieces(key, value_text)
        if not first:
            digest.update(b",")
            line_sha.update(b", ")
        first = False
        digest.update(canonical)
        line_sha.update(spelled)
    digest.update(b"}" + around[1])
    line_sha.update(b"}" + line_around[1])
    return "sha256:" + digest.hexdigest(), line_sha.digest()


def vouched_digest(*, chain: str, seq: int, hash: str, checkpoint: int) -> str:
    content = {"chain": chain, "seq": seq, "hash": hash, "checkpoint": checkpoint}
    if safe_integer(seq) and safe_integer(checkpoint):  # and two texts: plain
        return sha256_digest(canonical_plain_dumps(content))
    return sha256_digest(canonical_dumps(content))


def vouched_signed(vouched: AuditVouchedHead) -> bool:
    return vouched_row_signed(
        chain=vouched.chain,
        seq=vouched.seq,
        hash=vouched.hash,
        checkpoint=vouched.checkpoint,
        signature=vouched.signature,
    )


def vouched_row_signed(*, chain: str, seq: int, hash: str, checkpoint: int, signature: str) -> bool:
    digest = vouched_digest(chain=chain, seq=seq, hash=hash, checkpoint=checkpoint)
    return signed_by_key(digest, signature)


def _batches(chains: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(chains), _BATCH):
        yield chains[start : start + _BATCH]


def _vouched_for(chains: list[str]) -> dict[str, AuditVouchedHead]:
    """The vouched heads of one batch of ``chains``: one statement."""
    return {row.chain: row for row in AuditVouchedHead.objects.filter(chain__in=chains)}


def _events_since(spans: dict[str, tuple[int, int]]) -> dict[str, list[EventRow]]:
    """Each chain's events from seq ``lo`` to ``hi``, in order, for one batch of chains.

    As column tuples, not models; the caller passes one batch (``_batches``) at a time,
    so that a checkpoint after a large backlog holds one batch's events, not all of them.
    """
    found: dict[str, list[EventRow]] = {chain: [] for chain in spans}
    columns = event_columns("e.")
    rows = ", ".join(["(%s, %s, %s)"] * len(spans))
    params: list[Any] = []
    for chain, span in spans.items():
        params.extend([chain, *span])
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH v(chain, lo, hi) AS (VALUES {rows})"
            f" SELECT {columns} FROM recovery_auditevent e JOIN v ON e.operation_key = v.chain"
            " AND e.seq >= v.lo AND e.seq <= v.hi ORDER BY e.operation_key, e.seq",
            params,
        )
        for row in event_rows(cursor.fetchall()):
            found[row.chain].append(row)
    return found


def extension_break(
    chain: str, vouched: AuditVouchedHead | None, head_seq: int, events: list[EventRow]
) -> ChainBreak | None:
    """Why ``events`` (seq ``vouched.seq`` … ``head_seq``) do not extend ``vouched``, if so.

    Without a vouched head the chain is new to the checkpoints: it must link from
    genesis. The vouched event itself is checked for its hash and its content.
    """
    if vouched is not None and not vouched_signed(vouched):
        return ChainBreak(
            chain, vouched.seq, "its vouched head is not signed by the audit key (forged)"
        )
    start = vouched.seq if vouched is not None else 1
    if head_seq < start:
        assert vouched is not None
        return ChainBreak(
            chain,
            head_seq + 1,
            f"events after #{head_seq} are missing; checkpoint #{vouched.checkpoint} "
            f"signed #{vouched.seq} (cut)",
        )
    # The vouched event's predecessor is not read: its own hash is what was signed.
    prev_hash = None if vouched is not None else GENESIS_HASH
    expected = start
    for event in events:
        if (
            vouched is not None
            and event.seq == vouched.seq == expected
            and event.hash != vouched.hash
        ):
            return ChainBreak(
                chain,
                event.seq,
                f"differs from what checkpoint #{vouched.checkpoint} signed (rewritten)",
            )
        found = event_row_break(event, seq=expected, prev_hash=prev_hash)
        if found is not None:
            return found
        prev_hash = event.hash
        expected += 1
    if expected <= head_seq:
        return ChainBreak(chain, expected, "this event is missing (deleted)")
    return None


class CheckpointFileError(Exception):
    """The checkpoint was signed in the database but its line is not in the file yet.

    The next checkpoint writes it (``checkpoint_file_repair``); until then an alarm of
    kind ``checkpoint_file`` is open.
    """


def audit_checkpoint() -> AuditCheckpoint | None:
    """Sign the new heads of the chains that moved lately; None when nothing moved.

    Only a chain that extends its vouched head is signed (see the module docstring);
    the others are named in ``broken`` and raise an alarm. Also appended to
    ``SETTLE_AUDIT_CHECKPOINT_FILE``, outside the database, after the lines of earlier
    checkpoints the file lacks (a failed append, a kill after the commit): the rows are
    signed under the audit key, so writing their lines again adds nothing unsigned.
    Signers are serialised from the file's repair to its append (a session advisory
    lock, and a lock on the file). Raises ``CheckpointFileError`` when the file could
    not be made whole, after the checkpoint was signed and an alarm raised.
    """
    checkpoint: AuditCheckpoint | None = None
    if connection.in_atomic_block:  # a caller's transaction: its lines after its commit
        for part in _checkpoints_signed():
            transaction.on_commit(functools.partial(_checkpoint_file_append, part))
            checkpoint = part
        return checkpoint
    with _signers_serialised(), _checkpoint_file_open() as opened:
        handle, problem = opened
        repaired: list[int] = []
        if handle is not None:
            try:
                repaired = checkpoint_file_repair(handle)
            except (OSError, CheckpointFileProblem) as exc:
                problem = _file_problem_text(exc)
        for part in _checkpoints_signed():
            checkpoint = part
            if handle is not None and problem is None:
                try:
                    _line_append(handle, checkpoint_file_line(part))
                except OSError as exc:
                    problem = _file_problem_text(exc)
        if problem is not None:
            audit_file_alarm_raise(problem, checkpoint=audit_checkpoint_number())
            raise CheckpointFileError(problem)
        audit_file_alarm_clear(repaired=repaired, checkpoint=audit_checkpoint_number())
    return checkpoint


def audit_checkpoint_number() -> int:
    """The newest checkpoint's number (0: none yet)."""
    number = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
    return int(number or 0)


def _checkpoints_signed() -> Iterator[AuditCheckpoint]:
    """Sign the chains that moved: one checkpoint, or several after a large backlog.

    The chains that moved are listed once, in a temporary table, then signed a batch at
    a time in their order; a checkpoint holds at most ``CHECKPOINT_CHAINS`` of them, and
    the next one (same moment, rescan point and watermark, its own transaction) goes on
    from there. Memory holds one batch's events and one checkpoint's heads, however
    large the backlog; no checkpoint's ``heads`` outgrows a jsonb value.
    """
    with transaction.atomic():
        advisory_xact_lock(_CHECKPOINT_LOCK)
        # Not their heads: the first checkpoint's names every chain it saw.
        previous = AuditCheckpoint.objects.defer("heads", "broken").order_by("-number").first()
        if previous is not None:
            if not AuditEvent.objects.filter(id__gt=previous.watermark).exists():
                return  # nothing new since the last checkpoint
        elif not AuditEvent.objects.exists():
            return
        now = timezone.now()
        older = (
            AuditCheckpoint.objects.filter(made_at__lte=now - CHECKPOINT_RESCAN)
            .defer("heads", "broken")
            .order_by("-number")
            .first()
        )
        rescan_from = older.watermark if older is not None else 0
        watermark = _moved_listed(rescan_from)
    try:
        after: str | None = None
        number = previous.number if previous else 0
        prev_digest = previous.digest if previous else GENESIS_HASH
        done = False
        while not done:
            with transaction.atomic():
                advisory_xact_lock(_CHECKPOINT_LOCK)
                heads: dict[str, list[Any]] = {}
                broken: list[ChainBreak] = []
                while (room := CHECKPOINT_CHAINS - len(heads) - len(broken)) > 0:
                    page = _moved_page(after, min(_BATCH, room))
                    if not page:
                        done = True
                        break
                    after = page[-1][0]
                    _page_signed(page, heads, broken)
                if not heads and not broken:
                    continue  # only events already signed were written again
                number += 1
                checkpoint = AuditCheckpoint(
                    number=number,
                    made_at=now,
                    rescan_from=rescan_from,
                    watermark=watermark,
                    heads=heads,
                    broken=[item.as_record() for item in broken],
                    prev_digest=prev_digest,
                )
                checkpoint.digest = checkpoint_digest(checkpoint)
                checkpoint.signature = sign(checkpoint.digest)
                checkpoint.save()
                _vouched_write(heads, number)
                audit_alarms_raise(broken, checkpoint=checkpoint)
                prev_digest = checkpoint.digest
                del heads
            yield checkpoint
    finally:
        _moved_dropped()


# The most chains one checkpoint signs (its ``heads``); a larger backlog is signed by
# several in a row. Far below jsonb's 256 MiB (a head takes about 110 bytes).
CHECKPOINT_CHAINS = 200_000
_MOVED = "settle_checkpoint_moved"


def _moved_listed(after_id: int) -> int:
    """List every chain with an event whose id is above ``after_id``, with its newest
    seq, in a temporary table of this connection; the highest event id, the watermark."""
    _moved_dropped()
    with connection.cursor() as cursor:
        cursor.execute("SELECT MAX(id) FROM recovery_auditevent")
        top = cursor.fetchone()[0]
        watermark = int(top) if top is not None else after_id
        cursor.execute(
            f"CREATE TEMPORARY TABLE {_MOVED} AS SELECT operation_key AS chain, MAX(seq) AS"
            " head_seq FROM recovery_auditevent WHERE id > %s AND id <= %s GROUP BY"
            " operation_key",
            [after_id, watermark],
        )
        cursor.execute(f"CREATE INDEX {_MOVED}_chain ON {_MOVED} (chain)")
    return watermark


def _moved_page(after: str | None, limit: int) -> list[tuple[str, int]]:
    """The next ``limit`` chains that moved, after chain ``after``, in key order."""
    where = "" if after is None else " WHERE chain > %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT chain, head_seq FROM {_MOVED}{where} ORDER BY chain LIMIT %s",
            [*([after] if after is not None else []), limit],
        )
        return [(str(chain), int(seq)) for chain, seq in cursor.fetchall()]


def _moved_dropped() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {_MOVED}")


def _page_signed(
    page: list[tuple[str, int]], heads: dict[str, list[Any]], broken: list[ChainBreak]
) -> None:
    """Check one batch of chains that moved: their vouched heads and events read, each
    chain's extension checked, and let go; its new heads go to ``heads``."""
    moved = dict(page)
    vouched = _vouched_for(list(moved))
    spans = {
        chain: (vouched[chain].seq if chain in vouched else 1, head_seq)
        for chain, head_seq in moved.items()
    }
    events = _events_since(spans)
    for chain, head_seq in moved.items():
        found = extension_break(chain, vouched.get(chain), head_seq, events[chain])
        if found is not None:
            broken.append(found)
        elif chain not in vouched or head_seq > vouched[chain].seq:
            heads[chain] = [head_seq, events[chain][-1].hash]


@contextlib.contextmanager
def _signers_serialised() -> Iterator[None]:
    """One signer at a time from the file's repair to its append, across processes.

    A session advisory lock (PostgreSQL), held across the checkpoint's commit; the
    transaction's own lock (``_CHECKPOINT_LOCK``) is the same key, taken again.
    """
    if connection.vendor != "postgresql":
        yield  # SQLite: the lock on the file serialises the processes of one machine
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [_CHECKPOINT_LOCK])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_CHECKPOINT_LOCK])


@contextlib.contextmanager
def _checkpoint_file_open() -> Iterator[tuple[BinaryIO | None, str | None]]:
    """The checkpoint file, open and locked (``flock``), or why it cannot be.

    Its folder is made only before the first checkpoint: a folder or file gone later is
    storage that is not there (a mount that vanished), not a place to start afresh.
    """
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    try:
        if not path.exists():
            if AuditCheckpoint.objects.exists():
                raise CheckpointFileProblem(f"the checkpoint file {path} is missing")
            path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")  # noqa: SIM115 - closed below, after the lock
    except (OSError, CheckpointFileProblem) as exc:
        yield None, _file_problem_text(exc)
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield handle, None
    finally:
        handle.close()  # releases the lock


class CheckpointFileProblem(Exception):
    """The checkpoint file is not what the signed rows allow it to be made whole from."""


def _file_problem_text(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"the checkpoint file could not be written{where}: {exc.strerror or exc}"
    return str(exc)


# A line's end as ``checkpoint_file_line`` spells it: the keys after ``heads`` in order.
_LINE_TAIL = re.compile(
    rb'"number": ([0-9]+), "prev_digest": "[^"\\]*", "rescan_from": [0-9]+, '
    rb'"signature": "([^"\\]*)", "watermark": [0-9]+\}$'
)
_TAIL_READ = 1 << 16


def checkpoint_file_repair(handle: BinaryIO) -> list[int]:
    """Make the checkpoint file whole from the signed rows; the numbers of lines written.

    A last line cut short (the disk filled, the process was killed while writing) is
    cut off; then the lines of the checkpoints after the file's last one are written
    from the database, each checked against its digest and signature first. A file
    whose last line is not one the database signed is left as it is: that is for
    ``verify_audit`` to name, not for a checkpoint to paper over.
    """
    newest = audit_checkpoint_number()
    size = handle.seek(0, os.SEEK_END)
    end = _complete_end(handle, size)
    if end != size:
        handle.truncate(end)
        logger.warning("checkpoint file: a last line cut short was removed (%s bytes)", size - end)
    last = _last_line_number(handle, end)
    if last >= newest:
        return []
    written: list[int] = []
    expected_prev = GENESIS_HASH
    if last:
        expected_prev = AuditCheckpoint.objects.values_list("digest", flat=True).get(number=last)
    for checkpoint in AuditCheckpoint.objects.filter(number__gt=last).order_by("number"):
        if (
            checkpoint.prev_digest != expected_prev
            or checkpoint_digest(checkpoint) != checkpoint.digest
            or not signed_by_key(checkpoint.digest, checkpoint.signature)
        ):
            raise CheckpointFileProblem(
                f"checkpoint #{checkpoint.number} is not signed as it stands: its line is "
                "not written again (run verify_audit)"
            )
        handle.write(checkpoint_file_line(checkpoint).encode("utf-8") + b"\n")
        expected_prev = checkpoint.digest
        written.append(checkpoint.number)
    _synced(handle)
    logger.warning("checkpoint file: lines of checkpoints %s written again", written)
    return written


def _complete_end(handle: BinaryIO, size: int) -> int:
    """Where the file's last complete line ends (after its newline)."""
    position = size
    while position > 0:
        start = max(0, position - _TAIL_READ)
        handle.seek(start)
        piece = handle.read(position - start)
        newline = piece.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


def _last_line_number(handle: BinaryIO, end: int) -> int:
    """The number of the checkpoint on the file's last line (0: the file is empty)."""
    if end == 0:
        return 0
    start = max(0, end - _TAIL_READ)
    handle.seek(start)
    tail = handle.read(end - start).removesuffix(b"\n")
    found = _LINE_TAIL.search(tail)
    if found is None:
        raise CheckpointFileProblem(
            "the checkpoint file's last line is not one this version writes: not repaired"
        )
    number = int(found[1])
    signature = (
        AuditCheckpoint.objects.filter(number=number).values_list("signature", flat=True).first()
    )
    if signature is None or signature.encode("ascii") != found[2]:
        raise CheckpointFileProblem(
            f"the checkpoint file's last line (checkpoint #{number}) is not the database's: "
            "not repaired (run verify_audit)"
        )
    return number


def _line_append(handle: BinaryIO, line: str) -> None:
    handle.seek(0, os.SEEK_END)
    handle.write(line.encode("utf-8") + b"\n")
    _synced(handle)


def _synced(handle: BinaryIO) -> None:
    """On the disk before the signer lets go: a crash after this keeps the line."""
    handle.flush()
    os.fsync(handle.fileno())


def _vouched_write(heads: dict[str, list[Any]], number: int) -> None:
    rows = [
        AuditVouchedHead(
            chain=chain,
            seq=seq,
            hash=digest,
            checkpoint=number,
            signature=sign(vouched_digest(chain=chain, seq=seq, hash=digest, checkpoint=number)),
        )
        for chain, (seq, digest) in heads.items()
    ]
    AuditVouchedHead.objects.bulk_create(
        rows,
        batch_size=1000,
        update_conflicts=True,
        unique_fields=["chain"],
        update_fields=["seq", "hash", "checkpoint", "signature"],
    )


def checkpoint_file_line(checkpoint: AuditCheckpoint) -> str:
    """The checkpoint's line in ``SETTLE_AUDIT_CHECKPOINT_FILE`` (without its newline)."""
    line = {
        **checkpoint_content(checkpoint),
        "digest": checkpoint.digest,
        "signature": checkpoint.signature,
    }
    return json.dumps(line, sort_keys=True)


def _checkpoint_file_append(checkpoint: AuditCheckpoint) -> None:
    """Append one checkpoint's line, locked and synced (a caller's transaction committed)."""
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        _line_append(handle, checkpoint_file_line(checkpoint))
