"""The cursor every written-out statement runs on: libpq's own calls on the connection.

``with kept_cursor() as c: c.execute(sql, params)`` is ``connection.cursor()`` for the
statements ``dbsql`` writes out, less what Django and psycopg add to each one that
nothing here uses. Django's: a new database cursor made and closed, ``CursorWrapper``
around it, the async guard and the connection proxy's lookups on every call. psycopg's:
its cursor's generators driven by a wait loop, for a connection that one thread uses
and that waits for each answer anyway. What is kept is psycopg's own work on a
statement: its conversion of ``%s`` to ``$1`` (``PostgresQuery``), its adaptation of the
values and the rows (the connection's ``Transformer``, Django's loaders and dumpers
included), its prepared statements (the connection's ``PrepareManager``: the same
threshold, names, bound, and forgetting on a rollback as for the ORM's statements), its
``BEGIN`` where a transaction has not sent one yet, and its errors
(``error_from_result``). libpq then runs the statement in one blocking call
(``PQexecPrepared``, ``PQexecParams``: the interpreter's lock released, a signal handled
when it returns, within the session's ``statement_timeout``). A host API
lifecycle (``bench/api_profile.py --instructions``) took 10 % fewer of the web process's
instructions that way: 13.44 M against 14.91 M (and 13.34 M with ``COMMIT`` sent the same
way, ``settle.postgresql``).

What Django's own cursor guarantees stays: the connection opened (and health-checked)
as its cursors open it, errors raised as ``django.db`` errors, no statement in a
transaction already marked for rollback.

Where anything watches statements (``connection.execute_wrapper``, as
``bench/sqlcount.py`` counts them; ``assertNumQueries`` and ``DEBUG``'s query log), on
a connection that binds parameters on the client (``SETTLE_DB_PREPARED_STATEMENTS``
off) or is in pipeline mode, and on any database but PostgreSQL, it is Django's own
cursor, so that every statement is seen and sent as before.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextvars import ContextVar, Token
from threading import get_ident
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from psycopg import ClientCursor, errors, pq
from psycopg._preparing import Prepare
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

KEPT = "_dbsql_kept"  # on the connection wrapper: its Kept

# libpq's numbers (psycopg.pq): a transaction's status, a result's, a connection's.
_IDLE = pq.TransactionStatus.IDLE
_COMMAND_OK, _TUPLES_OK = pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_CONNECTION_BAD = pq.ConnStatus.BAD


class Kept:
    """What one psycopg connection's written-out statements share: the last result."""

    __slots__ = (
        "cursor",
        "pgconn",
        "position",
        "prepared",
        "query",
        "raw",
        "result",
        "transformer",
    )

    def __init__(self, cursor: Any) -> None:
        raw = cursor.connection
        self.raw, self.pgconn, self.cursor = raw, raw.pgconn, cursor
        # The adapters of a cursor Django made: the loaders it registers on one included.
        self.transformer = Transformer(cursor)
        self.query = PostgresQuery(self.transformer)  # each statement converted in turn
        self.prepared = raw._prepared  # psycopg's PrepareManager, the ORM's statements' too
        self.result: Any = None
        self.position = 0

    def usable(self, raw: Any) -> bool:
        return raw is self.raw and not raw.closed and raw._pipeline is None


def _raise_for(kept: Kept, result: Any) -> None:
    pgconn = kept.pgconn
    if pgconn.status == _CONNECTION_BAD:  # as psycopg's wait says a lost session
        raise errors.OperationalError(pq.error_message(result, encoding=pgconn._encoding))
    if result.status == _FATAL_ERROR:  # the server's error, by its SQLSTATE's class
        raise errors.error_from_result(result, encoding=pgconn._encoding)
    raise errors.InterfaceError(f"unexpected result from a statement: {result.status}")


def _run(kept: Kept, sql: str, params: Sequence[Any] | None) -> None:
    raw, pgconn = kept.raw, kept.pgconn
    if not raw.autocommit and pgconn.transaction_status == _IDLE:
        begun = pgconn.exec_(raw._get_tx_start_command())  # as psycopg begins one
        if begun.status != _COMMAND_OK:
            _raise_for(kept, begun)
    query = kept.query
    query.convert(sql, params)
    prepared = kept.prepared
    prepare, name = prepared.get(query)
    if prepare is Prepare.NO:
        result = pgconn.exec_params(query.query, query.params, query.types, query.formats)
    else:
        if prepare is Prepare.SHOULD:
            made = pgconn.prepare(name, query.query, query.types)
            if made.status != _COMMAND_OK:
                _raise_for(kept, made)
        result = pgconn.exec_prepared(name, query.params, query.formats)
    added = prepared.maybe_add_to_cache(query, prepare, name)
    if added is not None:
        prepared.validate(added, prepare, name, [result])
    if prepared._to_flush:  # a statement evicted past the bound: psycopg deallocates it
        raw.wait(prepared.maintain_gen(raw))
    status = result.status
    if status != _TUPLES_OK and status != _COMMAND_OK:
        _raise_for(kept, result)
    kept.transformer.set_pgresult(result)
    kept.result, kept.position = result, 0


class KeptCursor:
    """One statement at a time on the connection, its rows read from its result."""

    __slots__ = ("db", "kept")

    def __init__(self, db: BaseDatabaseWrapper, kept: Kept) -> None:
        self.db, self.kept = db, kept

    def __enter__(self) -> KeptCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None  # the result stays the connection's until its next statement

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        db = self.db
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            _run(self.kept, sql, params)

    def fetchone(self) -> Any:
        kept = self.kept
        if kept.position >= kept.result.ntuples:
            return None
        with self.db.wrap_database_errors:
            row = kept.transformer.load_row(kept.position, tuple)
        kept.position += 1
        return row

    def fetchall(self) -> list[Any]:
        kept = self.kept
        end = kept.result.ntuples
        with self.db.wrap_database_errors:
            rows: list[Any] = kept.transformer.load_rows(kept.position, end, tuple)
        kept.position = end
        return rows

    @property
    def rowcount(self) -> int:
        count = self.kept.result.command_tuples
        return -1 if count is None else int(count)


# The default database's connection pinned for a block (``connection_pin``), and the
# thread that pinned it: a context copied to another thread (asgiref's ``sync_to_async``)
# does not see it there, as asgiref's ``Local`` shows each thread its own connection.
_PINNED: ContextVar[tuple[int, BaseDatabaseWrapper] | None] = ContextVar(
    "dbsql_pinned", default=None
)


def default_connection() -> BaseDatabaseWrapper:
    """``connections[DEFAULT_DB_ALIAS]``: the one pinned for the block this runs in, else
    looked up (asgiref's ``Local``: about 10 thousand instructions, as much as libpq's
    work on a short statement; a pinned one costs a context variable's read)."""
    pinned = _PINNED.get()
    if pinned is not None and pinned[0] == get_ident():
        return pinned[1]
    return connections[DEFAULT_DB_ALIAS]


def connection_pin() -> tuple[BaseDatabaseWrapper, Token[Any]]:
    """Pin the default connection until ``connection_unpin``: for a block whose statements
    all run on it (a transaction's), so that each finds it without the lookup."""
    db = default_connection()
    return db, _PINNED.set((get_ident(), db))


def connection_unpin(token: Token[Any]) -> None:
    _PINNED.reset(token)


@functools.cache
def vendor() -> str:
    """The default database's vendor: one a process (as ``columns.quote``'s names), kept.

    ``connection.vendor`` looks the connection up on every call (asgiref's ``Local``:
    about 10 thousand instructions, as much as libpq's work on a short statement), and
    the written-out statements ask it at every turn."""
    return str(connections[DEFAULT_DB_ALIAS].vendor)


def kept_cursor(db: BaseDatabaseWrapper | None = None) -> KeptCursor | CursorWrapper:
    """A cursor on ``db`` (the default database) for ``with``: kept, or Django's (see above)."""
    if db is None:
        db = default_connection()
    if db.vendor != "postgresql" or db.queries_logged or db.execute_wrappers:
        return db.cursor()
    db.close_if_health_check_failed()
    kept = getattr(db, KEPT, None)
    if kept is None or not kept.usable(db.connection):
        cursor = db.cursor()  # opens the connection where it is not, as Django's does
        if _binds_on_client(cursor.cursor) or db.connection._pipeline is not None:
            return cursor
        kept = Kept(cursor.cursor)
        setattr(db, KEPT, kept)
    return KeptCursor(db, kept)


def _binds_on_client(cursor: Any) -> bool:
    return isinstance(cursor, ClientCursor)
