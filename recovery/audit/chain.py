"""Appending to the audit log: one hash chain per operation, and the system chain.

chain
    The events of one operation, in order (``operation_key``), or of nothing in
    particular (``""``, the system chain: providers, credentials, grants, exports).
    ``seq`` counts from 1; each event's ``hash`` covers the previous event's hash and its
    own canonical content.
head
    A chain's last event. An operation's head is kept in its own row (``audit_seq``,
    ``audit_hash``), read with the row lock that the change being audited holds anyway,
    and written with that change; so appending needs no lock of its own and two
    operations' writes never wait on each other. The system chain's head is kept the
    same way in ``AuditChainHead``, whose row its appenders lock. A unique (chain, seq)
    guarantees no chain ever forks.

Events are buffered for the duration of an ``audit_transaction`` and written in one
INSERT at its end, inside the same database transaction as the change they describe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache, wraps
from types import TracebackType
from typing import Any, NamedTuple, TypeVar, cast

from django.db import connection, transaction
from django.db.models import Case, Value, When
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from approvals.actors import Actor
from dbsql.rows import insert, update, values_update
from recovery.canonical import canonical_dumps, canonical_plain_dumps, plain_loads, safe_integer
from recovery.models import AuditChainHead, AuditEvent, Operation

F = TypeVar("F", bound=Callable[..., Any])

GENESIS_HASH = "sha256:" + "0" * 64
SYSTEM_CHAIN = ""
_TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%fZ"


def timestamp(at: datetime) -> str:
    """The exact text of a moment that hashes and signatures cover (UTC, microseconds)."""
    return at.astimezone(UTC).strftime(_TIMESTAMP)


def _content_hash(prev_hash: str, content: dict[str, Any], *, plain: bool = False) -> str:
    """sha256 of the previous hash's ASCII followed by the content's canonical JSON.

    ``content`` holds ``seq``, ``at`` (``timestamp``'s text), ``kind``,
    ``operation_key``, ``actor`` (its stored text) and ``data``: the one definition of
    an event's hash, for appending, verifying, and checking an export. ``plain``: the
    caller knows the content is plain JSON (``recovery.canonical.plain_loads``), so the
    same bytes are made without walking it first.
    """
    encoded = canonical_plain_dumps(content) if plain else canonical_dumps(content)
    return "sha256:" + hashlib.sha256(prev_hash.encode("ascii") + encoded).hexdigest()


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
            "at": timestamp(at),
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


class EventRow(NamedTuple):
    """An event as its columns hold it (``event_columns``): for reading many, no model.

    ``at`` is ``timestamp``'s text of the column, ``actor`` the column's text and
    ``data`` the column's JSON text; ``event_row_digest`` reads them as the model would.
    """

    chain: str
    seq: int
    at: str
    kind: str
    actor: str
    data: str
    prev_hash: str
    hash: str


# ``timestamp``'s text, made by PostgreSQL (to_char's YYYY pads to four digits, as
# ``strftime``'s %Y does for every year a ``datetime`` can hold from 1000 on).
_AT_TEXT = """to_char({table}at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def event_columns(table: str = "") -> str:
    """The SELECT list of an ``EventRow``; ``table`` qualifies the columns (``"e."``).

    Read the rows with ``event_rows``.
    """
    at = _AT_TEXT.format(table=table) if connection.vendor == "postgresql" else f"{table}at"
    columns = ["operation_key", "seq", at, "kind", "actor", "data", "prev_hash", "hash"]
    return ", ".join(column if column == at else table + column for column in columns)


def event_rows(fetched: list[tuple[Any, ...]]) -> Iterator[EventRow]:
    """``EventRow``s of rows a cursor fetched for ``event_columns``."""
    if connection.vendor == "postgresql":
        return map(EventRow._make, fetched)
    # SQLite: the column's text is naive UTC; the text hashed is ``timestamp``'s.
    return (EventRow(chain, seq, _sqlite_at(at), *rest) for chain, seq, at, *rest in fetched)


def _sqlite_at(value: str | datetime) -> str:
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return timestamp(value)


@lru_cache(maxsize=4096)
def _actor_hashed(stored: str) -> str:
    """The actor text ``event_digest`` hashes for this column text: the Actor read back."""
    return Actor.parse(stored).stored if stored else ""


def event_row_digest(row: EventRow) -> str:
    """``event_digest`` of the event whose columns are ``row``, without making the model."""
    data, plain = plain_loads(row.data)
    return _content_hash(
        row.prev_hash,
        {
            "seq": row.seq,
            "at": row.at,
            "kind": row.kind,
            "operation_key": row.chain,
            "actor": _actor_hashed(row.actor),
            "data": data,
        },
        # The other fields are text and seq: plain when seq is a safe integer.
        plain=plain and safe_integer(row.seq),
    )


def event_export(event: AuditEvent) -> dict[str, Any]:
    """An event as an export carries it: every field its hash covers, as hashed.

    ``at`` is the exact text the hash covers (microseconds, UTC) and ``actor`` the
    stored ``kind:id:name``, so that ``exported_event_hash`` (or any RFC 8785
    implementation) recomputes ``hash`` from the record alone.
    """
    return {
        "id": event.pk,
        "at": timestamp(event.at),
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


@dataclass(frozen=True)
class ChainBreak:
    """Where a chain stops holding, and why: the first problem a check found.

    ``seq`` 0 and chain ``""`` for a problem of no one event (a checkpoint, an alarm).
    """

    chain: str
    seq: int
    reason: str

    def __str__(self) -> str:
        where = f"chain {self.chain!r}" if self.chain else "the system chain"
        return f"{where}, event #{self.seq}: {self.reason}" if self.seq else self.reason

    def as_record(self) -> dict[str, Any]:
        return {"chain": self.chain, "seq": self.seq, "reason": self.reason}


def event_row_break(row: EventRow, *, seq: int, prev_hash: str | None) -> ChainBreak | None:
    """Why the event ``row`` is not its chain's event ``seq`` linked onto ``prev_hash``, if so.

    ``prev_hash`` None: the previous event is not at hand (a checkpoint starting at a
    head it vouched for). The one rule of a link, for checkpoints and verification.
    """
    if row.seq != seq:
        return ChainBreak(row.chain, seq, "this event is missing (deleted)")
    if prev_hash is not None and row.prev_hash != prev_hash:
        return ChainBreak(row.chain, row.seq, "prev_hash does not match the previous event")
    if event_row_digest(row) != row.hash:
        return ChainBreak(row.chain, row.seq, "content does not match its hash (edited)")
    return None


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
    # Chains touched, and the head their row holds (or will hold): the operation's own,
    # or the system chain's ``AuditChainHead``.
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
        """Write the events in one INSERT, then the heads no row holds yet."""
        insert(self.events)
        moved = {}
        for chain, saved in self.saved.items():
            head = self.heads.get(chain, saved)
            if head != saved:
                moved[chain] = head
        system = moved.pop(SYSTEM_CHAIN, None)
        if system is not None:
            AuditChainHead.objects.filter(chain=SYSTEM_CHAIN).update(seq=system[0], hash=system[1])
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
    if operation is None:
        head = _system_head_locked()
    else:
        locked = getattr(operation, "_audit_locked", False)
        if not locked:
            raise RuntimeError(f"append to {chain!r} with the operation locked by operation_lock()")
        if locked == "new" or not operation.audit_seq:
            head = (0, GENESIS_HASH)
        else:
            head = (operation.audit_seq, operation.audit_hash)
    buffer.saved[chain] = head
    return head


def _system_head_locked() -> tuple[int, str]:
    """Lock the system chain's head row (made on first use) and read it.

    The row is made only where the chain has no event yet: a missing row beside
    existing events was deleted, and appending from a guess would hide that.
    """
    AuditChainHead.objects.bulk_create(
        [AuditChainHead(chain=SYSTEM_CHAIN, seq=0, hash=GENESIS_HASH)], ignore_conflicts=True
    )
    row = AuditChainHead.objects.select_for_update().get(chain=SYSTEM_CHAIN)
    if row.seq == 0 and AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN).exists():
        raise RuntimeError("the system chain's head row is missing: run verify_audit")
    return (row.seq, row.hash)


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


# Said of every event appended inside ``audit_tagged``: the bulk batch it was part of.
_TAGS: ContextVar[dict[str, Any] | None] = ContextVar("settle_audit_tags", default=None)


@contextmanager
def audit_tagged(**tags: Any) -> Iterator[None]:
    """Every event appended inside carries ``tags`` in its data (a batch's id, say).

    So that the services a bulk action reuses need not each pass the batch along.
    """
    token = _TAGS.set({**(_TAGS.get() or {}), **tags})
    try:
        yield
    finally:
        _TAGS.reset(token)


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
    tags = _TAGS.get()
    data = {**(data or {}), **tags} if tags else (data or {})
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
