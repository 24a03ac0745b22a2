"""Django's PostgreSQL backend as Settle runs it (settle.postgresql).

A held connection is checked before a request reuses it by asking its socket, not the
database: no statement when nothing arrived, and a session the server ended is found
dead and opened again. Timestamps are read by psycopg's own loader, to the same values
Django's gives."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

pytestmark = pytest.mark.django_db

# The embedded default (SQLite) keeps no connection across requests: Django's own
# backend, nothing to check. Each test says so there rather than being skipped.
POSTGRES = connection.vendor == "postgresql"


@pytest.fixture
def held() -> Iterator[BaseDatabaseWrapper]:
    """A second connection to the test database, idle between statements as a web
    worker's is between requests (the test's own runs inside a transaction)."""
    other = connections.create_connection("default")
    other.ensure_connection()
    yield other
    other.close()


def _last_statement(pid: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
        return str(cursor.fetchone()[0])


def test_a_live_held_connection_passes_the_check_without_a_statement(held):
    if not POSTGRES:
        assert type(held).__module__ == "django.db.backends.sqlite3.base"
        return
    assert type(held).__module__ == "settle.postgresql.base"
    assert held.settings_dict["CONN_HEALTH_CHECKS"] is True
    with held.cursor() as cursor:
        cursor.execute("SELECT 'the last statement'")
    assert held.is_usable()
    assert _last_statement(held.connection.info.backend_pid) == "SELECT 'the last statement'"


def test_a_session_the_server_ended_fails_the_check_and_the_next_request_reconnects(held):
    if not POSTGRES:
        return
    pid = held.connection.info.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 10
    while held.is_usable():  # until the server's goodbye reaches the socket
        assert time.monotonic() < deadline, "a terminated session still passed the check"
        time.sleep(0.01)
    # What a request's start does with it: closed, then opened again by its first statement.
    held.health_check_done = False
    held.close_if_health_check_failed()
    assert held.connection is None
    with held.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid


# Timestamps as the server writes them in a UTC session: fractions, before 1970, far on.
TIMESTAMPS = """
    SELECT '2026-12-07 15:36:29.962988+00'::timestamptz,
           '2026-12-07 16:36:29+01'::timestamptz,
           '1969-07-20 20:17:40.5+00'::timestamptz,
           '9999-12-31 23:59:59.999999+00'::timestamptz,
           '0001-01-01 00:00:00+00'::timestamptz,
           now()
"""


def test_timestamps_are_read_by_psycopgs_own_loader_to_the_values_djangos_gives(held):
    if not POSTGRES:
        return
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg import adapters
    from psycopg.pq import Format

    with held.cursor() as cursor:
        cursor.execute(TIMESTAMPS)
        read = cursor.fetchone()
        loader = cursor.cursor._tx.get_loader(1184, Format.TEXT)
    assert type(loader) is adapters.get_loader(1184, Format.TEXT)  # compiled, not Django's
    with held.cursor() as cursor:
        register_tzloader(datetime.UTC, cursor.cursor)  # Django's own, as before
        cursor.execute(TIMESTAMPS)
        djangos = cursor.fetchone()
        assert type(cursor.cursor._tx.get_loader(1184, Format.TEXT)).__name__ == (
            "SpecificTzLoader"
        )
    assert read[:5] == djangos[:5]
    assert all(value.tzinfo is datetime.UTC for value in read + djangos)
    assert read[0] == datetime.datetime(2026, 12, 7, 15, 36, 29, 962988, datetime.UTC)
    assert read[1] == read[0].replace(microsecond=0)


@pytest.mark.django_db(transaction=True)
def test_a_commit_is_one_libpq_call_and_its_error_djangos(held, monkeypatch):
    """COMMIT through libpq where nothing watches (psycopg's ``commit()`` never called),
    through psycopg's where Django logs statements; an error at COMMIT (a deferred
    constraint) is Django's ``IntegrityError`` either way, the transaction gone."""
    from django.db import IntegrityError, transaction
    from django.test.utils import CaptureQueriesContext

    if not POSTGRES:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE commit_probe (id integer, CONSTRAINT commit_probe_once "
            "UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)"
        )
    try:
        committed: list[str] = []
        commit = type(connection.connection).commit

        def psycopgs(self: object) -> None:
            committed.append("psycopg")
            commit(self)

        monkeypatch.setattr(type(connection.connection), "commit", psycopgs)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO commit_probe (id) VALUES (1)")
        assert committed == []
        with held.cursor() as cursor:  # another session sees it: committed
            cursor.execute("SELECT count(*) FROM commit_probe")
            assert cursor.fetchone() == (1,)
        refused = pytest.raises(IntegrityError, match="commit_probe_once")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO commit_probe (id) VALUES (1)")
        assert committed == []
        assert connection.connection.info.transaction_status == 0  # IDLE: nothing left open
        logged = CaptureQueriesContext(connection)
        with logged, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO commit_probe (id) VALUES (2)")
        assert committed == ["psycopg"]
        with held.cursor() as cursor:
            cursor.execute("SELECT array_agg(id ORDER BY id) FROM commit_probe")
            assert cursor.fetchone() == ([1, 2],)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE commit_probe")


def test_a_connection_refuses_an_event_loops_thread_as_djangos_guard_does(
    held: BaseDatabaseWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ensure_connection`` and ``commit`` (the two a request calls most) keep Django's
    guard, asked without its exception: refused where a loop runs, unless
    ``DJANGO_ALLOW_ASYNC_UNSAFE``; allowed where none does."""
    if not POSTGRES:
        assert connection.vendor == "sqlite"  # Django's own backend and guard
        return
    from settle.postgresql.base import DatabaseWrapper

    assert DatabaseWrapper.ensure_connection is not BaseDatabaseWrapper.ensure_connection
    assert DatabaseWrapper.commit is not BaseDatabaseWrapper.commit
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)

    async def in_a_loop() -> list[str]:
        refused = []
        for call in (held.ensure_connection, held.commit):
            try:
                call()
            except SynchronousOnlyOperation:
                refused.append(call.__name__)
        return refused

    assert asyncio.run(in_a_loop()) == ["ensure_connection", "commit"]
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert asyncio.run(in_a_loop()) == []
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE")
    held.ensure_connection()
    held.commit()  # no loop in this thread: allowed


def test_the_autocommit_mode_is_set_as_psycopgs_setter_sets_it(held: BaseDatabaseWrapper) -> None:
    """Idle: the mode recorded, and the next statement runs in it; in a transaction:
    psycopg's refusal, as Django's error, the mode left as it was."""
    if not POSTGRES:
        assert connection.vendor == "sqlite"  # Django's own backend
        return
    from django.db import ProgrammingError

    held.set_autocommit(False)
    assert held.connection.autocommit is False and held.get_autocommit() is False
    with held.cursor() as cursor:
        cursor.execute("SELECT 1")
    status = held.connection.pgconn.transaction_status
    assert status == psycopg.pq.TransactionStatus.INTRANS  # psycopg began one
    with pytest.raises(ProgrammingError, match="can't change 'autocommit' now"):
        held._set_autocommit(True)
    assert held.connection.autocommit is False
    held.rollback()
    held.set_autocommit(True)
    assert held.connection.autocommit is True
    with held.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert held.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_method_put_on_djangos_wrapper_since_is_the_one_called(
    held: BaseDatabaseWrapper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As pytest-django blocks ``ensure_connection`` outside tests marked for the database:
    the guard's cheaper asking must not step around such a patch."""
    called = []
    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", lambda self: called.append(self))
    held.ensure_connection()
    assert called == [held]
