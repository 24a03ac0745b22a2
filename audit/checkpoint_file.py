"""The checkpoint file: every signed checkpoint, one line each, outside the database.

Appended under a lock (signers are serialised), synced, and made whole again from the
signed rows when a line is missing (storage gone, a kill between commit and append),
under a ``checkpoint_file`` alarm meanwhile. ``verify_audit`` reads it against the rows.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import connection

from audit.hashing import GENESIS_HASH
from audit.models import AuditCheckpoint
from audit.seal import (
    CHECKPOINT_LINE_TAIL,
    checkpoint_digest,
    checkpoint_file_line,
    signed_by_key,
)

logger = logging.getLogger("settle.audit")

# Advisory lock key (PostgreSQL): one checkpoint is made at a time.
_CHECKPOINT_LOCK = 0x5E771E02


def advisory_xact_lock(*keys: int) -> None:
    """Take a PostgreSQL advisory lock until this transaction ends.

    On SQLite writers are serialised already (``BEGIN IMMEDIATE``): nothing to take.
    """
    if connection.vendor == "postgresql":
        placeholders = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({placeholders})", list(keys))


def audit_checkpoint_number() -> int:
    """The newest checkpoint's number (0: none yet)."""
    number = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
    return int(number or 0)


class CheckpointFileError(Exception):
    """The checkpoint was signed in the database but its line is not in the file yet.

    The next checkpoint writes it (``checkpoint_file_repair``); until then an alarm of
    kind ``checkpoint_file`` is open.
    """


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
    found = CHECKPOINT_LINE_TAIL.search(tail)
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


def _checkpoint_file_append(checkpoint: AuditCheckpoint) -> None:
    """Append one checkpoint's line, locked and synced (a caller's transaction committed)."""
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        _line_append(handle, checkpoint_file_line(checkpoint))
