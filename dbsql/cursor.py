"""The cursor every written-out statement runs on: the connection's own, kept.

``with kept_cursor() as c: c.execute(sql, params)`` is ``connection.cursor()`` for the
statements ``dbsql`` writes out, less what Django adds to each one that nothing here
uses: a new database cursor made and closed, ``CursorWrapper`` around it, the async
guard and the connection proxy's lookups on every call (on the host API's path about
a third of a statement's cost in the web process, ``bench/core.py``). What Django's
own cursor guarantees stays: the connection opened (and health-checked) as its
cursors open it, errors raised as ``django.db`` errors, no statement in a transaction
already marked for rollback.

Where anything watches statements (``connection.execute_wrapper``, as
``bench/sqlcount.py`` counts them; ``assertNumQueries`` and ``DEBUG``'s query log),
and on any database but PostgreSQL, it is Django's own cursor, so that every
statement is seen as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

KEPT = "_dbsql_cursor"  # on the connection wrapper: (psycopg connection, its cursor)


class KeptCursor:
    """One statement at a time on the connection's kept psycopg cursor."""

    __slots__ = ("cursor", "db")

    def __init__(self, db: BaseDatabaseWrapper, cursor: Any) -> None:
        self.db, self.cursor = db, cursor

    def __enter__(self) -> KeptCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None  # kept for the next statement; its next execute drops these rows

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> None:
        db = self.db
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            self.cursor.execute(sql, params)

    def fetchone(self) -> Any:
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self.db.wrap_database_errors:
            rows: list[Any] = self.cursor.fetchall()
            return rows

    @property
    def rowcount(self) -> int:
        return int(self.cursor.rowcount)


def kept_cursor() -> KeptCursor | CursorWrapper:
    """A cursor on the default database for ``with``: kept, or Django's (see above)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql" or db.queries_logged or db.execute_wrappers:
        return db.cursor()
    db.close_if_health_check_failed()
    raw = db.connection
    kept = getattr(db, KEPT, None)
    if raw is None or kept is None or kept[0] is not raw or raw.closed:
        wrapper = db.cursor()  # opens the connection where it is not, as Django's does
        kept = (db.connection, wrapper.cursor)
        setattr(db, KEPT, kept)
    return KeptCursor(db, kept[1])
