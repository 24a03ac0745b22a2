"""Verifying the whole audit log: every chain, every checkpoint, the file outside.

``audit_verify`` reads every event once, in chain order, and checks it against its
predecessor, its own hash and every checkpoint that signed its seq — not only the
newest, so that a head signed again after a rewrite cannot hide what was signed
before; each operation's stored head is compared with its chain as the chains are read
(``_HeadsCompared``), and each signed vote against the passkey that signed it
(``audit.signed_decisions``). Then the system chain's stored head, the vouched heads
and the alarms. It names the first problem found. The verifications kept on the record
(routine, full in slices, and their status) are ``audit.verification``'s.

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

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection

from audit.alarms import alarm_signed
from audit.chain import holder_model
from audit.hashing import (
    GENESIS_HASH,
    SYSTEM_CHAIN,
    ChainBreak,
    EventRow,
    event_columns,
    event_rows,
)
from audit.kinds import AuditKind
from audit.models import (
    AuditAlarm,
    AuditChainHead,
    AuditEvent,
    AuditVouchedHead,
)
from audit.seal import vouched_row_signed
from audit.seal_verify import Signed, _checkpoints_verified, _cut_problem, _newest, _SignedHeads
from audit.signed_decisions import EventChecks


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
        f"SELECT {event_columns()} FROM {AuditEvent._meta.db_table}"
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
    events = EventChecks()
    try:
        found = _chains_walked(after, until, chunk_size, tally, events)
        # A signed vote passed before the problem found (or before the end) comes first.
        return events.first_break() or found
    finally:
        events.close()


def _chains_walked(
    after: str | None, until: str | None, chunk_size: int, tally: VerifyTally, events: EventChecks
) -> ChainBreak | None:
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
        found = events.row_break(row, seq=length + 1, prev_hash=prev_hash)
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
        sql = f"SELECT key, audit_seq, audit_hash FROM {holder_model()._meta.db_table}"
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
