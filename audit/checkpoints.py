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
    ``broken`` list, raises an ``audit_broken`` alarm (``audit.alarms``) and
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

import functools
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.alarms import (
    audit_alarms_raise,
    audit_file_alarm_clear,
    audit_file_alarm_raise,
)
from audit.checkpoint_file import (
    _CHECKPOINT_LOCK,
    CheckpointFileError,
    CheckpointFileProblem,
    _checkpoint_file_append,
    _checkpoint_file_open,
    _file_problem_text,
    _line_append,
    _signers_serialised,
    advisory_xact_lock,
    audit_checkpoint_number,
    checkpoint_file_repair,
)
from audit.hashing import (
    GENESIS_HASH,
    ChainBreak,
    EventRow,
    event_columns,
    event_row_break,
    event_rows,
)
from audit.models import AuditCheckpoint, AuditEvent, AuditVouchedHead
from audit.seal import (
    checkpoint_digest,
    checkpoint_file_line,
    sign,
    vouched_digest,
    vouched_signed,
)

logger = logging.getLogger("settle.audit")

# A checkpoint scans again the events of this long before its predecessor, so that an
# event whose transaction committed after that predecessor was made is still covered.
CHECKPOINT_RESCAN = timedelta(minutes=2)
# Chains read in one statement (their vouched heads, their new events).
_BATCH = 500


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
            f" SELECT {columns} FROM audit_auditevent e JOIN v ON e.operation_key = v.chain"
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
        cursor.execute("SELECT MAX(id) FROM audit_auditevent")
        top = cursor.fetchone()[0]
        watermark = int(top) if top is not None else after_id
        cursor.execute(
            f"CREATE TEMPORARY TABLE {_MOVED} AS SELECT operation_key AS chain, MAX(seq) AS"
            " head_seq FROM audit_auditevent WHERE id > %s AND id <= %s GROUP BY"
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
