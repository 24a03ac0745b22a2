"""The database's clock: the one place that knows how each database reads it.

Permits, leases and approvals are judged by the database's clock, not by a web
worker's: on PostgreSQL, ``statement_timestamp()``, read by the very statement that
judges by it where one does. On SQLite (one process's file, the embedded default,
whose writers are serialised) this process's clock stands in, and reading it needs no
statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Expression
from django.utils import timezone

from dbsql.cursor import kept_cursor, vendor


@dataclass(frozen=True)
class Clock:
    """The clock as a statement reads it: ``sql`` with its ``params``.

    ``local`` is this process's clock when it stands in for the database's (and then
    ``sql`` is a parameter holding it); None when the database reads its own.
    """

    sql: str
    params: tuple[Any, ...]
    local: datetime | None


_STATEMENT_TIMESTAMP = Clock("statement_timestamp()", (), None)


def clock() -> Clock:
    """The database's clock, for a statement to read (the one vendor branch)."""
    if vendor() == "postgresql":
        return _STATEMENT_TIMESTAMP
    now = timezone.now()
    return Clock("%s", (DateTimeField().get_db_prep_value(now, connection),), now)


def db_now() -> datetime:
    """The database's clock now, read by a statement of its own (none on SQLite)."""
    now = clock()
    if now.local is not None:
        return now.local
    with kept_cursor() as cursor:
        cursor.execute(f"SELECT {now.sql}", now.params)
        value: datetime = cursor.fetchone()[0]
    return value


class DatabaseNow(Expression):
    """The database's clock in an ORM query: ``update(revoked_at=DatabaseNow())``."""

    output_field = DateTimeField()

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        now = clock()
        return now.sql, now.params
