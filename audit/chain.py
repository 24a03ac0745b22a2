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
What must run after them, last before the commit (a budget paid last: ``policies``),
is given to ``audit_transaction_last``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache, wraps
from threading import get_ident
from types import TracebackType
from typing import Any, TypeVar, cast

from django.apps import apps
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Q, Value, When
from django.utils import timezone

from audit.hashing import GENESIS_HASH, SYSTEM_CHAIN, event_digest
from audit.models import AuditChainHead, AuditEvent, ChainHolder
from common.actors import Actor
from dbsql.batches import values_update
from dbsql.cursor import connection_pin, connection_unpin, default_connection
from dbsql.rows import model_unsaved
from dbsql.writes import Rider, insert, update_sql

F = TypeVar("F", bound=Callable[..., Any])

Held = TypeVar("Held", bound=ChainHolder)


@lru_cache(maxsize=1)
def holder_model() -> type[ChainHolder]:
    """The model whose rows keep their own chain's head (``SETTLE_AUDIT_CHAIN_MODEL``)."""
    return cast(type[ChainHolder], apps.get_model(settings.SETTLE_AUDIT_CHAIN_MODEL))


def audit_chain_locked(operation: Held) -> Held:
    """Mark ``operation`` as locked by its caller, so that events may join its chain.

    The chain's head is read at the first append, after the lock was granted: read in
    the locking statement itself it could predate a holder that appended and committed
    while that statement waited.
    """
    setattr(operation, "_audit_locked", True)  # noqa: B010 - a mark, not a field
    return operation


def audit_head_new(operation: ChainHolder) -> None:
    """A freshly inserted operation starts an empty chain (no other writer can see it)."""
    setattr(operation, "_audit_locked", "new")  # noqa: B010


@dataclass(frozen=True)
class _Ride:
    """A write run by the events' statement; what it names, and who hears its row count."""

    write: Rider
    keys: frozenset[Hashable]
    counted: Callable[[int], object] | None


@dataclass(frozen=True)
class HeadRide:
    """A write of the row that keeps a chain's head, run by the events' statement and
    built only then, with the head as it stands at the end (``audit_transaction_head_ride``).

    ``state``: what its owner needs to build it, and to join a later change of the same
    row to it (``audit_transaction_head_ridden``)."""

    state: Any
    build: Callable[[Any, tuple[int, str]], Rider]
    counted: Callable[[Any, int], object]


@dataclass
class _Buffer:
    """Events of one ``audit_transaction`` level, and where each chain's head stands."""

    events: list[AuditEvent] = field(default_factory=list)
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Chains touched, and the head their row holds (or will hold): the operation's own,
    # or the system chain's ``AuditChainHead``.
    saved: dict[str, tuple[int, str]] = field(default_factory=dict)
    # What runs after the events and heads are written, in order (audit_transaction_last).
    last: list[Callable[[], None]] = field(default_factory=list)
    # Writes run by the events' own statement (audit_transaction_rider).
    riders: list[_Ride] = field(default_factory=list)
    # Writes of a chain's holder row that also write its head (audit_transaction_head_ride).
    head_rides: dict[str, HeadRide] = field(default_factory=dict)
    parent: _Buffer | None = None

    def head(self, chain: str) -> tuple[int, str] | None:
        return self._find("heads", chain)

    def _find(self, name: str, chain: str) -> tuple[int, str] | None:
        for buffer in self._levels():
            found = getattr(buffer, name).get(chain)
            if found is not None:
                return cast(tuple[int, str], found)
        return None

    def _levels(self) -> Iterator[_Buffer]:
        """This level, then each enclosing one, out to the transaction's."""
        buffer: _Buffer | None = self
        while buffer is not None:
            yield buffer
            buffer = buffer.parent

    def merge_into(self, parent: _Buffer) -> None:
        parent.events.extend(self.events)
        parent.heads.update(self.heads)
        parent.saved.update(self.saved)
        parent.last.extend(self.last)
        parent.riders.extend(self.riders)
        parent.head_rides.update(self.head_rides)

    def flush(self) -> None:
        """Write the events in one INSERT with the heads no row holds yet; then run
        what was given to run last."""
        self._write()
        for run in self.last:
            run()

    def head_ride(self, chain: str) -> HeadRide | None:
        for buffer in self._levels():
            found = buffer.head_rides.get(chain)
            if found is not None:
                return found
        return None

    def rides(self, key: Hashable) -> bool:
        return any(key in ride.keys for buffer in self._levels() for ride in buffer.riders)

    def _write(self) -> None:
        """The events in one INSERT, with the riders and the heads that moved: on
        PostgreSQL one chain's head and the system chain's ride in the events' statement
        (none of its other writes reads them), a batch's heads after it."""
        moved = {}
        for chain, saved in self.saved.items():
            head = self.heads.get(chain, saved)
            if head != saved:
                moved[chain] = head
        heads: list[Rider] = []
        system = moved.pop(SYSTEM_CHAIN, None)
        if system is not None:
            values = {"seq": system[0], "hash": system[1]}
            heads.append(update_sql(AuditChainHead, where={"chain": SYSTEM_CHAIN}, values=values))
        # A holder row written by its head ride takes the head with it: never two writes
        # of one row in one statement.
        head_rides: list[tuple[HeadRide, Rider]] = []
        for chain, head_ride in self.head_rides.items():
            moved.pop(chain, None)
            head_rides.append((head_ride, head_ride.build(head_ride.state, self.heads[chain])))
        if len(moved) == 1:
            [(chain, (seq, digest))] = moved.items()
            values = {"audit_seq": seq, "audit_hash": digest}
            heads.append(update_sql(holder_model(), where={"key": chain}, values=values))
        counts: list[int] = []
        riders = [ride.write for ride in self.riders] + [write for _, write in head_rides]
        insert(self.events, riders=riders + heads, rider_counts=counts)
        for ride, count in zip(self.riders, counts[: len(self.riders)], strict=True):
            if ride.counted is not None:
                ride.counted(count)
        for (head_ride, _), count in zip(head_rides, counts[len(self.riders) :], strict=False):
            head_ride.counted(head_ride.state, count)
        if len(moved) > 1 and connection.vendor == "postgresql":  # every head in one UPDATE
            values_update(
                holder_model(),
                values=[("key", "key"), ("seq", "audit_seq"), ("hash", "audit_hash")],
                rows=[(chain, seq, digest) for chain, (seq, digest) in moved.items()],
                assign={"audit_seq": "v.seq", "audit_hash": "v.hash"},
                match="key",
            )
        elif len(moved) > 1:
            holder_model()._default_manager.filter(Q(key__in=list(moved))).update(
                audit_seq=Case(*(When(key=c, then=Value(h[0])) for c, h in moved.items())),
                audit_hash=Case(*(When(key=c, then=Value(h[1])) for c, h in moved.items())),
            )


# The innermost ``audit_transaction`` open in this thread (or task), with the thread: a
# context variable, not an attribute of the connection, which a request's appends ask for
# at every turn (a lookup of the connection costs about 10 thousand instructions,
# ``dbsql.cursor.default_connection``); a context copied to another thread does not see it,
# as that thread has a connection, and so transactions, of its own.
_OPEN: ContextVar[tuple[int, _Buffer] | None] = ContextVar("settle_audit_open", default=None)


class audit_transaction:
    """``transaction.atomic`` that also writes the events appended inside it, at its end.

    Nested blocks merge their events into the enclosing one on success and drop them on
    an exception, exactly as their savepoint does with the rows.
    """

    def __init__(self) -> None:
        self._atomic = transaction.atomic()

    def __enter__(self) -> None:
        self._atomic.__enter__()
        _, self._pinned = connection_pin()  # its statements all run on it
        _OPEN.set((get_ident(), _Buffer(parent=_open_buffer())))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        open_ = _OPEN.get()
        assert open_ is not None and open_[0] == get_ident(), "entered here"
        buffer = open_[1]
        _OPEN.set((get_ident(), buffer.parent) if buffer.parent is not None else None)
        try:
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
        finally:
            connection_unpin(self._pinned)
        return None

    def __call__(self, function: F) -> F:
        @wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with audit_transaction():
                return function(*args, **kwargs)

        return cast(F, inner)


def audit_transaction_last(run: Callable[[], None]) -> None:
    """Run ``run`` at the end of the outermost ``audit_transaction`` open, after its
    events and heads are written, just before it commits; dropped with the block it was
    given in if that rolls back. What it raises rolls the whole transaction back.

    For a lock that every writer of a kind takes (a budget's): taken last, it is held
    for one statement and the commit, not for the rest of the transaction.
    """
    _current_buffer().last.append(run)


def audit_transaction_rider(
    write: Rider,
    *,
    keys: Iterable[Hashable] = (),
    counted: Callable[[int], object] | None = None,
) -> None:
    """Run ``write`` (``dbsql.writes.update_sql``'s, say) with the events of the outermost
    ``audit_transaction`` open, in their statement on PostgreSQL (no round trip of its
    own); dropped with the block it was given in if that rolls back. ``counted`` hears
    its row count then; ``keys`` name what it writes (``audit_transaction_rides``).

    Only a write of rows that no statement of the transaction reads or writes again,
    and that reads no row another write of the transaction changes: until the events
    are written it is not, and the writes of one statement do not see each other's rows
    (the webhook outbox's rows, of operations no other rider names; a report's receipt,
    its transition told that the receipt is complete rather than reading it).
    """
    _current_buffer().riders.append(_Ride(write, frozenset(keys), counted))


def audit_transaction_head_ride(chain: str, ride: HeadRide) -> None:
    """Have the events' statement write the row that keeps ``chain``'s head with ``ride``
    (in place of a ride of that chain given before), which writes the head too.

    As ``audit_transaction_rider``'s writes: only where no statement of the transaction
    reads or writes that row again (on PostgreSQL, where the events' statement carries
    other writes). Its row count goes to ``ride.counted``, which may raise.
    """
    _current_buffer().head_rides[chain] = ride


def audit_transaction_head_ridden(chain: str) -> HeadRide | None:
    """The head ride given for ``chain`` in the transaction open, not written yet."""
    buffer = _open_buffer()
    return buffer.head_ride(chain) if buffer is not None else None


def audit_transaction_rides(key: Hashable) -> bool:
    """Whether a rider of the transaction open, not written yet, names ``key``: then a
    write that must see its rows runs after the events (``audit_transaction_last``)."""
    buffer = _open_buffer()
    return buffer is not None and buffer.rides(key)


def audit_transaction_open() -> bool:
    """Whether an ``audit_transaction`` is open here (its riders and last steps run)."""
    return _open_buffer() is not None


def _current_buffer() -> _Buffer:
    buffer = _open_buffer()
    if buffer is None:
        raise RuntimeError("audit_append must run inside the audit_transaction it describes")
    return buffer


def _open_buffer() -> _Buffer | None:
    """The innermost ``audit_transaction``'s buffer, if one is open in a transaction."""
    open_ = _OPEN.get()
    if open_ is None or open_[0] != get_ident():
        return None
    return open_[1] if default_connection().in_atomic_block else None


def _chain_head(buffer: _Buffer, chain: str, operation: ChainHolder | None) -> tuple[int, str]:
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


def audit_head_fields(operation: ChainHolder) -> dict[str, Any]:
    """Columns that store the chain's current head in the operation's row.

    For a change that writes the operation row anyway (a transition, an insert): the
    head rides along; call ``audit_head_saved`` once that write succeeded, so that the
    end of the transaction need not write it again.
    """
    head = _current_buffer().head(operation.key)
    return {} if head is None else {"audit_seq": head[0], "audit_hash": head[1]}


def audit_head_saved(operation: ChainHolder, fields: dict[str, Any]) -> None:
    if fields:
        _current_buffer().saved[operation.key] = (fields["audit_seq"], fields["audit_hash"])


def audit_head_write(operation: ChainHolder) -> None:
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
    operation: ChainHolder | None = None,
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
    event = model_unsaved(
        AuditEvent,
        id=None,
        seq=seq + 1,
        at=timezone.now(),
        kind=kind,
        operation_key=chain,
        actor=actor,
        data=data,
        prev_hash=prev_hash,
        hash="",
    )
    event.hash = event_digest(event)
    buffer.events.append(event)
    buffer.heads[chain] = (event.seq, event.hash)
    return event
