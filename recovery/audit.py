"""The append-only audit log: one hash chain per operation, and signed checkpoints.

chain
    The events of one operation, in order (``operation_key``), or of nothing in
    particular (``""``, the system chain: providers, credentials). ``seq`` counts from 1;
    each event's ``hash`` covers the previous event's hash and its own canonical content.
head
    A chain's last event. An operation's head is also kept in its own row
    (``audit_seq``, ``audit_hash``), read with the row lock that the change being
    audited holds anyway, and written with that change; so appending needs no lock of
    its own and two operations' writes never wait on each other. The system chain
    takes an advisory lock. A unique (chain, seq) guarantees no chain ever forks.
checkpoint
    An HMAC-signed statement of chain heads (``AuditCheckpoint``) under the audit key,
    which is not in the database, also appended to a file outside it. A chain can only
    grow, so a checkpointed head that is later missing or different is proof of a cut,
    a deletion, a truncation or a rewrite — even one whose hashes were all recomputed.
window
    Events newer than the newest checkpoint are protected by their chains and by their
    operation's own head only: someone with SQL access who rewrites or cuts such events
    and rewinds the head to match goes unnoticed. Checkpoints bound that window.

Events are buffered for the duration of an ``audit_transaction`` and written in one
INSERT at its end, inside the same database transaction as the change they describe.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import wraps
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from approvals.actors import Actor
from approvals.rowsql import insert, update, values_update
from recovery.canonical import canonical_dumps, sha256_digest
from recovery.models import AuditCheckpoint, AuditEvent, AuditVerification, Operation

F = TypeVar("F", bound=Callable[..., Any])

GENESIS_HASH = "sha256:" + "0" * 64
SYSTEM_CHAIN = ""
# Advisory lock keys (PostgreSQL): the system chain, and the making of checkpoints.
_SYSTEM_CHAIN_LOCK = 0x5E771E01
_CHECKPOINT_LOCK = 0x5E771E02
# A checkpoint scans again the events of this long before its predecessor, so that an
# event whose transaction committed after that predecessor was made is still covered.
CHECKPOINT_RESCAN = timedelta(minutes=2)


_TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%fZ"


def _timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime(_TIMESTAMP)


def advisory_xact_lock(*keys: int) -> None:
    """Take a PostgreSQL advisory lock until this transaction ends.

    On SQLite writers are serialised already (``BEGIN IMMEDIATE``): nothing to take.
    """
    if connection.vendor == "postgresql":
        placeholders = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({placeholders})", list(keys))


def _content_hash(prev_hash: str, content: dict[str, Any]) -> str:
    """sha256 of the previous hash's ASCII followed by the content's canonical JSON.

    ``content`` holds ``seq``, ``at`` (``_timestamp``'s text), ``kind``,
    ``operation_key``, ``actor`` (its stored text) and ``data``: the one definition of
    an event's hash, for appending, verifying, and checking an export.
    """
    return (
        "sha256:" + hashlib.sha256(prev_hash.encode("ascii") + canonical_dumps(content)).hexdigest()
    )


def event_hash(
    *,
    prev_hash: str,
    seq: int,
    at: datetime,
    kind: str,
    operation_key: str,
    actor: str,
    data: dict[str, Any],
) -> str:
    return _content_hash(
        prev_hash,
        {
            "seq": seq,
            "at": _timestamp(at),
            "kind": kind,
            "operation_key": operation_key,
            "actor": actor,
            "data": data,
        },
    )


def event_digest(event: AuditEvent) -> str:
    """The hash ``event`` must carry: its ``prev_hash`` and its content, as stored."""
    return event_hash(
        prev_hash=event.prev_hash,
        seq=event.seq,
        at=event.at,
        kind=event.kind,
        operation_key=event.operation_key,
        actor=event.actor.stored if event.actor else "",
        data=event.data,
    )


def event_export(event: AuditEvent) -> dict[str, Any]:
    """An event as an export carries it: every field its hash covers, as hashed.

    ``at`` is the exact text the hash covers (microseconds, UTC) and ``actor`` the
    stored ``kind:id:name``, so that ``exported_event_hash`` (or any RFC 8785
    implementation) recomputes ``hash`` from the record alone.
    """
    return {
        "id": event.pk,
        "at": _timestamp(event.at),
        "chain": event.operation_key,
        "seq": event.seq,
        "kind": event.kind,
        "actor": event.actor.stored if event.actor else "",
        "data": event.data,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def exported_event_hash(record: dict[str, Any]) -> str:
    """The hash an exported event must carry, from its exported fields alone.

    ``data`` may be the object or its canonical JSON text (the CSV export's form).
    """
    data = record["data"]
    return _content_hash(
        str(record["prev_hash"]),
        {
            "seq": int(record["seq"]),
            "at": str(record["at"]),
            "kind": str(record["kind"]),
            "operation_key": str(record["chain"]),
            "actor": str(record["actor"]),
            "data": json.loads(data) if isinstance(data, str) else data,
        },
    )


# -- appending ------------------------------------------------------------------------


def audit_chain_locked(operation: Operation) -> Operation:
    """Mark ``operation`` as locked by its caller, so that events may join its chain.

    The chain's head is read at the first append, after the lock was granted: read in
    the locking statement itself it could predate a holder that appended and committed
    while that statement waited.
    """
    setattr(operation, "_audit_locked", True)  # noqa: B010 - a mark, not a field
    return operation


def audit_head_new(operation: Operation) -> None:
    """A freshly inserted operation starts an empty chain (no other writer can see it)."""
    setattr(operation, "_audit_locked", "new")  # noqa: B010


@dataclass
class _Buffer:
    """Events of one ``audit_transaction`` level, and where each chain's head stands."""

    events: list[AuditEvent] = field(default_factory=list)
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Operation chains touched, and the head their operation row holds (or will hold).
    saved: dict[str, tuple[int, str]] = field(default_factory=dict)
    parent: _Buffer | None = None

    def head(self, chain: str) -> tuple[int, str] | None:
        return self._find("heads", chain)

    def _find(self, name: str, chain: str) -> tuple[int, str] | None:
        buffer: _Buffer | None = self
        while buffer is not None:
            found = getattr(buffer, name).get(chain)
            if found is not None:
                return cast(tuple[int, str], found)
            buffer = buffer.parent
        return None

    def merge_into(self, parent: _Buffer) -> None:
        parent.events.extend(self.events)
        parent.heads.update(self.heads)
        parent.saved.update(self.saved)

    def flush(self) -> None:
        """Write the events in one INSERT, then the heads no operation row holds yet."""
        insert(self.events)
        moved = {}
        for chain, saved in self.saved.items():
            head = self.heads.get(chain, saved)
            if head != saved:
                moved[chain] = head
        if len(moved) == 1:
            [(chain, (seq, digest))] = moved.items()
            update(Operation, where={"key": chain}, values={"audit_seq": seq, "audit_hash": digest})
        elif moved and connection.vendor == "postgresql":  # a batch: every head in one UPDATE
            values_update(
                Operation,
                values=[("key", "key"), ("seq", "audit_seq"), ("hash", "audit_hash")],
                rows=[(chain, seq, digest) for chain, (seq, digest) in moved.items()],
                assign={"audit_seq": "v.seq", "audit_hash": "v.hash"},
                match="key",
            )
        elif moved:
            Operation.objects.filter(key__in=list(moved)).update(
                audit_seq=Case(*(When(key=c, then=Value(h[0])) for c, h in moved.items())),
                audit_hash=Case(*(When(key=c, then=Value(h[1])) for c, h in moved.items())),
            )


class audit_transaction:
    """``transaction.atomic`` that also writes the events appended inside it, at its end.

    Nested blocks merge their events into the enclosing one on success and drop them on
    an exception, exactly as their savepoint does with the rows.
    """

    def __init__(self) -> None:
        self._atomic = transaction.atomic()

    def __enter__(self) -> None:
        self._atomic.__enter__()
        current: _Buffer | None = getattr(connection, "settle_audit", None)
        connection.settle_audit = _Buffer(parent=current)  # type: ignore[attr-defined]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        buffer: _Buffer = connection.settle_audit  # type: ignore[attr-defined]
        connection.settle_audit = buffer.parent  # type: ignore[attr-defined]
        try:
            if exc_type is None:
                if buffer.parent is not None:
                    buffer.merge_into(buffer.parent)
                else:
                    buffer.flush()
        except BaseException as error:
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        self._atomic.__exit__(exc_type, exc, tb)
        return None

    def __call__(self, function: F) -> F:
        @wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with audit_transaction():
                return function(*args, **kwargs)

        return cast(F, inner)


def _current_buffer() -> _Buffer:
    buffer: _Buffer | None = getattr(connection, "settle_audit", None)
    if buffer is None or not connection.in_atomic_block:
        raise RuntimeError("audit_append must run inside the audit_transaction it describes")
    return buffer


def _chain_head(buffer: _Buffer, chain: str, operation: Operation | None) -> tuple[int, str]:
    known = buffer.head(chain)
    if known is not None:
        return known
    if operation is not None:
        locked = getattr(operation, "_audit_locked", False)
        if not locked:
            raise RuntimeError(f"append to {chain!r} with the operation locked by operation_lock()")
        if locked == "new" or not operation.audit_seq:
            head = (0, GENESIS_HASH)
        else:
            head = (operation.audit_seq, operation.audit_hash)
        buffer.saved[chain] = head
        return head
    advisory_xact_lock(_SYSTEM_CHAIN_LOCK)
    last = (
        AuditEvent.objects.filter(operation_key=chain)
        .order_by("-seq")
        .values_list("seq", "hash")
        .first()
    )
    return (0, GENESIS_HASH) if last is None else (int(last[0]), str(last[1]))


def audit_head_fields(operation: Operation) -> dict[str, Any]:
    """Columns that store the chain's current head in the operation's row.

    For a change that writes the operation row anyway (a transition, an insert): the
    head rides along; call ``audit_head_saved`` once that write succeeded, so that the
    end of the transaction need not write it again.
    """
    head = _current_buffer().head(operation.key)
    return {} if head is None else {"audit_seq": head[0], "audit_hash": head[1]}


def audit_head_saved(operation: Operation, fields: dict[str, Any]) -> None:
    if fields:
        _current_buffer().saved[operation.key] = (fields["audit_seq"], fields["audit_hash"])


def audit_head_write(operation: Operation) -> None:
    """Set the head on an operation about to be inserted (see ``audit_head_fields``)."""
    fields = audit_head_fields(operation)
    for name, value in fields.items():
        setattr(operation, name, value)
    audit_head_saved(operation, fields)


def audit_retract(event: AuditEvent) -> None:
    """Take back the newest event of its chain, whose change did not happen after all."""
    audit_retract_many([event])


def audit_retract_many(events: list[AuditEvent]) -> None:
    """``audit_retract`` for a batch: each event the newest of its own chain.

    Other chains' events appended after one of them stay: chains are independent.
    """
    if not events:
        return
    buffer = _current_buffer()
    for event in events:
        newest = buffer.heads.get(event.operation_key)
        assert newest == (event.seq, event.hash), "only the newest event of its chain"
        buffer.heads[event.operation_key] = (event.seq - 1, event.prev_hash)
    retracted = {id(event) for event in events}
    kept = [event for event in buffer.events if id(event) not in retracted]
    assert len(kept) == len(buffer.events) - len(retracted), "events of this transaction level"
    buffer.events = kept


def audit_append(
    *,
    kind: str,
    operation: Operation | None = None,
    actor: Actor | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Add one event to its chain; it is written when the ``audit_transaction`` ends.

    ``operation`` must come from ``operation_lock`` (or be freshly created, see
    ``audit_head_new``); without one the event goes to the system chain.
    """
    buffer = _current_buffer()
    chain = operation.key if operation is not None else SYSTEM_CHAIN
    seq, prev_hash = _chain_head(buffer, chain, operation)
    data = data or {}
    event = AuditEvent(
        seq=seq + 1,
        at=timezone.now(),
        kind=kind,
        operation_key=chain,
        actor=actor,
        data=data,
        prev_hash=prev_hash,
    )
    event.hash = event_digest(event)
    buffer.events.append(event)
    buffer.heads[chain] = (event.seq, event.hash)
    return event


# -- checkpoints --------------------------------------------------------------------


def _sign(digest: str) -> str:
    key = str(settings.SETTLE_AUDIT_KEY).encode("utf-8")
    return "hmac-sha256:" + hmac.new(key, digest.encode("ascii"), hashlib.sha256).hexdigest()


def _checkpoint_content(checkpoint: AuditCheckpoint) -> dict[str, Any]:
    return {
        "number": checkpoint.number,
        "made_at": _timestamp(checkpoint.made_at),
        "rescan_from": checkpoint.rescan_from,
        "watermark": checkpoint.watermark,
        "heads": checkpoint.heads,
        "prev_digest": checkpoint.prev_digest,
    }


def _checkpoint_digest(checkpoint: AuditCheckpoint) -> str:
    return sha256_digest(canonical_dumps(_checkpoint_content(checkpoint)))


def _scan_heads(after_id: int) -> tuple[dict[str, list[Any]], int]:
    """The newest (seq, hash) of every chain with an event whose id is above ``after_id``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.operation_key, e.seq, e.hash, m.top FROM recovery_auditevent e JOIN ("
            " SELECT operation_key, MAX(seq) AS seq, MAX(id) AS top FROM recovery_auditevent"
            " WHERE id > %s GROUP BY operation_key"
            ") m ON e.operation_key = m.operation_key AND e.seq = m.seq",
            [after_id],
        )
        rows = cursor.fetchall()
    heads = {key: [int(seq), str(digest)] for key, seq, digest, _ in rows}
    watermark = max((int(top) for *_, top in rows), default=after_id)
    return heads, watermark


def audit_checkpoint() -> AuditCheckpoint | None:
    """Sign the heads of the chains that moved lately; None when nothing moved.

    Also appended to ``SETTLE_AUDIT_CHECKPOINT_FILE``, outside the database.
    """
    with transaction.atomic():
        advisory_xact_lock(_CHECKPOINT_LOCK)
        previous = AuditCheckpoint.objects.order_by("-number").first()
        if previous is not None:
            if not AuditEvent.objects.filter(id__gt=previous.watermark).exists():
                return None  # nothing new since the last checkpoint
        elif not AuditEvent.objects.exists():
            return None
        now = timezone.now()
        older = (
            AuditCheckpoint.objects.filter(made_at__lte=now - CHECKPOINT_RESCAN)
            .order_by("-number")
            .first()
        )
        rescan_from = older.watermark if older is not None else 0
        heads, watermark = _scan_heads(rescan_from)
        checkpoint = AuditCheckpoint(
            number=previous.number + 1 if previous else 1,
            made_at=now,
            rescan_from=rescan_from,
            watermark=watermark,
            heads=heads,
            prev_digest=previous.digest if previous else GENESIS_HASH,
        )
        checkpoint.digest = _checkpoint_digest(checkpoint)
        checkpoint.signature = _sign(checkpoint.digest)
        checkpoint.save()
        transaction.on_commit(lambda: _checkpoint_file_append(checkpoint))
    return checkpoint


def _checkpoint_file_append(checkpoint: AuditCheckpoint) -> None:
    path = Path(settings.SETTLE_AUDIT_CHECKPOINT_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {
        **_checkpoint_content(checkpoint),
        "digest": checkpoint.digest,
        "signature": checkpoint.signature,
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, sort_keys=True) + "\n")


# -- verification -------------------------------------------------------------------


@dataclass(frozen=True)
class ChainBreak:
    """The first problem found: which chain, which event (or checkpoint), and why."""

    chain: str
    seq: int
    reason: str

    def __str__(self) -> str:
        where = f"chain {self.chain!r}" if self.chain else "the system chain"
        return f"{where}, event #{self.seq}: {self.reason}" if self.seq else self.reason


def _checkpoint_problem(checkpoint: AuditCheckpoint, expected_prev: str) -> str | None:
    if checkpoint.prev_digest != expected_prev:
        return f"checkpoint #{checkpoint.number} does not follow its predecessor"
    if _checkpoint_digest(checkpoint) != checkpoint.digest:
        return f"checkpoint #{checkpoint.number} was edited (its digest does not match)"
    if not hmac.compare_digest(_sign(checkpoint.digest), checkpoint.signature):
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


def _vouched_heads(checkpoints: list[AuditCheckpoint]) -> dict[str, tuple[int, str, int]]:
    """chain → (seq, hash, checkpoint number): the newest head each checkpoint vouches for."""
    heads: dict[str, tuple[int, str, int]] = {}
    for checkpoint in checkpoints:
        for chain, (seq, digest) in checkpoint.heads.items():
            if chain not in heads or seq >= heads[chain][0]:
                heads[chain] = (int(seq), str(digest), checkpoint.number)
    return heads


def _vouched_problem(chain: str, length: int, vouched: tuple[int, str, int] | None) -> str | None:
    if vouched is None or vouched[0] <= length:
        return None
    seq, _, number = vouched
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
    vouched = _vouched_heads(checkpoints)
    chain: str | None = None
    length = 0
    prev_hash = GENESIS_HASH
    events = AuditEvent.objects.order_by("operation_key", "seq").iterator(chunk_size=chunk_size)
    for event in events:
        tally.events += 1
        if event.operation_key != chain:
            if chain is not None:
                cut = _vouched_problem(chain, length, vouched.pop(chain, None))
                if cut:
                    yield ChainBreak(chain, length + 1, cut)
                    return
            chain, length, prev_hash = event.operation_key, 0, GENESIS_HASH
        if event.seq != length + 1:
            yield ChainBreak(chain, length + 1, "this event is missing (deleted)")
            return
        if event.prev_hash != prev_hash:
            yield ChainBreak(chain, event.seq, "prev_hash does not match the previous event")
            return
        if event_digest(event) != event.hash:
            yield ChainBreak(chain, event.seq, "content does not match its hash (edited)")
            return
        expected = vouched.get(chain)
        if expected is not None and expected[0] == event.seq and expected[1] != event.hash:
            yield ChainBreak(
                chain,
                event.seq,
                f"differs from what checkpoint #{expected[2]} signed (rewritten)",
            )
            return
        length, prev_hash = event.seq, event.hash
    if chain is not None:
        cut = _vouched_problem(chain, length, vouched.pop(chain, None))
        if cut:
            yield ChainBreak(chain, length + 1, cut)
            return
    for missing, head in sorted(vouched.items()):
        problem = _vouched_problem(missing, 0, head)
        if problem:
            yield ChainBreak(missing, 1, problem)
            return
    yield from _operation_heads_disagree()


def _operation_heads_disagree() -> Iterator[ChainBreak]:
    """Operations whose row names a head their chain does not end with.

    Catches a cut or rewrite of the newest events that left the operation's row alone,
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
