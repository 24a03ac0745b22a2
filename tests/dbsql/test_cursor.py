"""The kept cursor: Django's guarantees for each statement, run through libpq's own calls
where nothing watches; Django's own cursor wherever something does."""

from __future__ import annotations

import contextvars
import datetime
import threading
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.test.utils import CaptureQueriesContext

from dbsql.cursor import (
    KeptCursor,
    connection_pin,
    connection_unpin,
    default_connection,
    kept_cursor,
)

pytestmark = pytest.mark.django_db

# Each test states what its database does: PostgreSQL's kept cursor, or (SQLite, the
# embedded default) Django's. Neither is skipped on the other.
KEPT = connection.vendor == "postgresql"


def _value(sql: str, params: list[Any]) -> Any:
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_on_postgresql_every_statement_runs_through_libpq_not_psycopgs_cursor(monkeypatch):
    first, second = kept_cursor(), kept_cursor()
    if not KEPT:
        assert isinstance(first, CursorWrapper) and isinstance(second, CursorWrapper)
        return
    assert isinstance(first, KeptCursor) and isinstance(second, KeptCursor)
    assert first.kept is second.kept and first.kept.raw is connection.connection

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a kept statement went through psycopg's cursor")

    monkeypatch.setattr(psycopg.Cursor, "execute", refused)
    assert _value("SELECT %s + 1", [41]) == 42
    with kept_cursor() as cursor:
        cursor.execute("SELECT n FROM generate_series(1, 3) n WHERE n > %s", [1])
        assert cursor.fetchone() == (2,)
        assert cursor.fetchall() == [(3,)] and cursor.fetchone() is None
        assert cursor.rowcount == 2
        cursor.execute("SELECT %s::jsonb, %s::timestamptz", ['{"a": 1}', "2026-01-02T03:04:05Z"])
        text, at = cursor.fetchone()  # as Django's loaders read them: JSON left as its text
        assert text == '{"a": 1}' and at == datetime.datetime(
            2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC
        )


@pytest.mark.django_db(transaction=True)
def test_a_statement_that_opens_the_transaction_sends_its_begin_first():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE kept_begun (id integer PRIMARY KEY)")
    with transaction.atomic():
        with kept_cursor() as cursor:  # the transaction's first statement
            cursor.execute("INSERT INTO kept_begun (id) VALUES (%s)", [1])
        transaction.set_rollback(True)
    assert _value("SELECT count(*) FROM kept_begun WHERE id > %s", [0]) == 0


def _prepared_here(marker: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", [f"%{marker}%"]
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_repeated_statement_is_prepared_in_psycopgs_cache_and_again_after_a_rollback():
    """psycopg deallocates every prepared statement on a rollback: the kept statements'
    are in its cache, so it forgets them too and prepares them again."""
    if not KEPT:
        return
    sql = "SELECT %s::integer + 1 AS kept_repeated"
    connection.ensure_connection()
    threshold = connection.connection.prepare_threshold
    assert threshold is not None
    for n in range(threshold + 2):
        assert _value(sql, [n]) == n + 1
    assert _prepared_here("kept_repeated") == 1
    cached = connection.connection._prepared._names
    assert [key for key in cached if b"kept_repeated" in key[0]]
    with transaction.atomic():
        assert _value(sql, [1]) == 2
        transaction.set_rollback(True)
    assert _value(sql, [2]) == 3  # prepared no more, psycopg knows it: not prepared and missing
    assert _prepared_here("kept_repeated") == 0
    for n in range(threshold + 2):
        assert _value(sql, [n]) == n + 1
    assert _prepared_here("kept_repeated") == 1


@pytest.mark.django_db(transaction=True)
def test_a_connection_binding_on_the_client_gets_djangos_cursor():
    if not KEPT:
        return
    settings = {**connection.settings_dict}
    settings["OPTIONS"] = {**settings["OPTIONS"], "server_side_binding": False}
    other = type(connections["default"])(settings)
    try:
        cursor = kept_cursor(other)
        assert isinstance(cursor, CursorWrapper) and isinstance(cursor.cursor, psycopg.ClientCursor)
        with cursor:
            cursor.execute("SELECT %s + 1", [1])
            assert cursor.fetchone() == (2,)
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_session_the_server_ended_is_djangos_operational_error_then_opened_again():
    if not KEPT:
        return
    other = connections.create_connection("default")
    try:
        with kept_cursor(other) as cursor:
            cursor.execute("SELECT pg_backend_pid() + %s", [0])
            pid = cursor.fetchone()[0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(OperationalError), kept_cursor(other) as cursor:
            cursor.execute("SELECT %s", [1])
        other.close_if_unusable_or_obsolete()  # what the request's end does
        with kept_cursor(other) as cursor:
            cursor.execute("SELECT pg_backend_pid() + %s", [0])
            assert cursor.fetchone()[0] != pid
    finally:
        other.close()


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
        assert after.kept is not before.kept
        assert after.kept.raw is connection.connection
        assert not after.kept.raw.closed


def test_a_pinned_connection_is_the_threads_own_and_unpinned_at_the_end():
    db, token = connection_pin()
    try:
        assert db is connections["default"]
        assert default_connection() is db
        seen: list[Any] = []
        copied = contextvars.copy_context()  # as asgiref's sync_to_async carries it
        thread = threading.Thread(target=lambda: seen.append(copied.run(default_connection) is db))
        thread.start()
        thread.join()
        assert seen == [False]  # that thread's own connection, as Django's lookup gives it
    finally:
        connection_unpin(token)
    assert default_connection() is connections["default"]
