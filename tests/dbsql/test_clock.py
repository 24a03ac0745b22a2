"""The database's clock: read by the statement that judges by it, the same on every path."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approver
from dbsql.clock import DatabaseNow, clock, db_now

pytestmark = pytest.mark.django_db

# Each test states what its database does: PostgreSQL's own clock, or (SQLite, the
# embedded default) this process's standing in. Neither is skipped on the other.


def test_the_clock_is_the_statements_own_timestamp_or_this_processs_as_a_parameter():
    if connection.vendor == "postgresql":
        now = clock()
        assert (now.sql, now.params, now.local) == ("statement_timestamp()", (), None)
        return
    with time_machine.travel("2026-06-01 12:00:00Z", tick=False):
        now = clock()
        assert now.sql == "%s" and now.local == timezone.now()
    assert len(now.params) == 1


def test_db_now_reads_the_database_clock_in_a_statement_of_its_own_or_needs_none():
    if connection.vendor == "postgresql":
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            first = db_now()
            second = db_now()
        sql = [q["sql"] for q in queries.captured_queries]
        assert sql == ["SELECT statement_timestamp()"] * 2
        assert first.tzinfo is not None and first <= second  # per statement, not transaction
        assert abs((first - timezone.now()).total_seconds()) < 5
        return
    with (
        CaptureQueriesContext(connection) as queries,
        time_machine.travel("2026-06-01 12:00:00Z", tick=False),
    ):
        assert db_now() == timezone.now()
    assert queries.captured_queries == []


def test_database_now_writes_the_clock_in_an_orm_update():
    approver = Approver.objects.create(name="phone", token_hash="sha256:x", providers=[])
    before = db_now()
    with CaptureQueriesContext(connection) as queries:
        Approver.objects.filter(pk=approver.pk).update(disabled_at=DatabaseNow())
    assert len(queries.captured_queries) == 1
    approver.refresh_from_db()
    assert approver.disabled_at is not None
    assert before <= approver.disabled_at <= before + timedelta(seconds=5)
    if connection.vendor == "postgresql":
        assert "statement_timestamp()" in queries.captured_queries[0]["sql"]
