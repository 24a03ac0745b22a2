"""The kept cursor: Django's guarantees for each statement, without its wrapping where
nothing watches; Django's own cursor wherever something does."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext

from dbsql.cursor import KeptCursor, kept_cursor

pytestmark = pytest.mark.django_db

# Each test states what its database does: PostgreSQL's kept cursor, or (SQLite, the
# embedded default) Django's. Neither is skipped on the other.
KEPT = connection.vendor == "postgresql"


def _value(sql: str, params: list[Any]) -> Any:
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_on_postgresql_every_statement_runs_on_one_kept_cursor_else_on_djangos():
    first, second = kept_cursor(), kept_cursor()
    if not KEPT:
        assert isinstance(first, CursorWrapper) and isinstance(second, CursorWrapper)
        return
    assert isinstance(first, KeptCursor) and isinstance(second, KeptCursor)
    assert first.cursor is second.cursor
    assert first.cursor.connection is connection.connection
    assert _value("SELECT %s + 1", [41]) == 42
    with kept_cursor() as cursor:
        cursor.execute("SELECT n FROM generate_series(1, 3) n WHERE n > %s", [1])
        assert cursor.fetchall() == [(2,), (3,)] and cursor.rowcount == 2


def test_a_watched_connection_gets_djangos_cursor_so_that_every_statement_is_seen():
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        assert isinstance(kept_cursor(), CursorWrapper)
        assert _value("SELECT %s", [7]) == 7
    assert seen == ["SELECT %s"]
    with CaptureQueriesContext(connection) as queries:  # assertNumQueries, DEBUG's log
        assert isinstance(kept_cursor(), CursorWrapper)
        assert _value("SELECT %s", [8]) == 8
    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 8"]


def test_errors_are_djangos_and_a_transaction_marked_for_rollback_runs_no_statement():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE kept_probe (id integer PRIMARY KEY)")
    with kept_cursor() as cursor:
        cursor.execute("INSERT INTO kept_probe (id) VALUES (%s)", [1])
    with pytest.raises(IntegrityError), transaction.atomic(), kept_cursor() as cursor:
        cursor.execute("INSERT INTO kept_probe (id) VALUES (%s)", [1])
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(transaction.TransactionManagementError):
            _value("SELECT count(*) FROM kept_probe WHERE id > %s", [0])
    assert _value("SELECT count(*) FROM kept_probe WHERE id > %s", [0]) == 1


@pytest.mark.django_db(transaction=True)
def test_a_closed_connection_is_opened_again_with_a_cursor_of_its_own():
    before = kept_cursor()
    assert _value("SELECT %s", [1]) == 1
    connection.close()
    after = kept_cursor()
    assert _value("SELECT %s", [2]) == 2
    if KEPT:
        watched = (connection.queries_logged, connection.execute_wrappers)
        assert isinstance(before, KeptCursor) and isinstance(after, KeptCursor), watched
        assert after.cursor is not before.cursor
        assert after.cursor.connection is connection.connection
        assert not after.cursor.connection.closed
