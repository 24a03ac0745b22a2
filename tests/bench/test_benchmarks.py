"""The benchmark commands at a small size, and the bounds they measure as honest tests.

The figures themselves are never asserted (docs/benchmarks.md): only that the commands
run, refuse a database that is not theirs, and that a page's statement count does not
grow with the number of operations or the depth of the page.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.verify_walk import audit_verify
from bench import seed
from bench.console import PAGES
from tests.support.celery_fixtures import test_database_url


def _figures(out: io.StringIO) -> dict[str, Any]:
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_benchmark_console_seeds_then_measures_every_page_beside_the_admin(db):
    out = io.StringIO()
    call_command("benchmark_console", operations=200, requests=2, stdout=out)
    figures = _figures(out)
    assert figures["operations"] == 200
    assert set(figures["pages"]) == {page.name for page in PAGES}
    for name, page in figures["pages"].items():
        if page == "not built":  # built by another branch; measured once merged
            assert name in ("dashboard", "bulk_preview")
            continue
        assert page["p50_ms"] > 0 and page["p95_ms"] >= page["p50_ms"]
        assert 0 < page["sql"] <= 10, name
    assert figures["admin_changelist"]["sql"] > 0
    # The seeded log is a valid one: verify_audit finds nothing wrong with it.
    assert next(iter(audit_verify()), None) is None


def test_benchmark_console_refuses_a_database_that_holds_operations(db):
    seed.seed_operations(1)
    with pytest.raises(CommandError, match="already holds 1 operations"):
        call_command("benchmark_console", operations=10, stdout=io.StringIO())


def _statements(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured.captured_queries)


def _next_query(client: Client, path: str) -> str:
    found = re.search(r'href="\?([^"]*after=[^"]*)"', client.get(path).content.decode())
    assert found, "a next page"
    return "/?" + found.group(1).replace("&amp;", "&")


def test_each_page_costs_the_same_statements_at_either_size_and_any_depth(db, monkeypatch):
    from console.views import queue

    monkeypatch.setattr(queue, "PAGE_SIZE", 3)
    root = User.objects.create_superuser("root", "", "unused-pw-0123")
    client = Client()
    client.force_login(root)
    seed.seed_operations(200)
    pages = ["/", "/?state=reconcile", "/?q=bench-0000", "/audit/"]
    stuck = seed.operation_key(100)
    client.get("/")  # content types and the like are cached by the first request
    small = {path: _statements(client, path) for path in pages}
    small["operation"] = _statements(client, f"/operations/{stuck}/")
    seed.seed_operations(2000, first=200)  # eleven times as many, 110 stuck
    large = {path: _statements(client, path) for path in pages}
    large["operation"] = _statements(client, f"/operations/{stuck}/")
    deep = _next_query(client, _next_query(client, _next_query(client, "/")))
    assert small == large
    assert _statements(client, deep) == large["/"]
    assert all(count <= 10 for count in large.values()), large


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="EXPLAIN's plans are PostgreSQL's (CI runs it)"
)
def test_the_search_by_provider_reference_reads_indexes_not_the_tables(db):
    from recovery.models import Dispatch, Evidence

    seed.seed_operations(2000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    plans = []
    for rows in (
        Evidence.objects.filter(provider_reference=seed.provider_reference(100)),
        Dispatch.objects.filter(receipt_reference="RR-00000101"),
    ):
        sql, params = rows.values("operation").query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            plans.append("\n".join(line for (line,) in cursor.fetchall()))
    assert "evidence_provider_reference" in plans[0] and "Seq Scan" not in plans[0]
    assert "receipt_reference" in plans[1] and "Seq Scan" not in plans[1]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="EXPLAIN's plans are PostgreSQL's (CI runs it)"
)
@pytest.mark.parametrize("query", ["", "state=stranded", "q=bench-0000010", "verdict=absent"])
def test_the_queue_page_reads_its_partial_indexes_and_stops(db, query):
    """The page's one statement (rows and counts) can be served by ``operation_unsettled``
    and ``operation_stranded`` and the primary key alone: no part of it needs a scan of
    the operations table. (At 2,000 rows a sequential scan is the cheapest way to join
    the page's 51 ids, so the planner is told not to: what is checked is that nothing
    in the statement, an OR across branches say, leaves it no index to use. At 1M the
    plans are in docs/benchmarks.md.)"""
    from recovery.selectors.queue import QueueFilters, operations_queue_for_user

    seed.seed_operations(2000)
    root = User.objects.create_superuser("root", "", "unused-pw-0123")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    statements: list[tuple[str, Any]] = []

    def kept(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    form = dict(part.split("=") for part in query.split("&") if part)
    filters = QueueFilters(
        state=form.get("state", ""), search=form.get("q", ""), verdict=form.get("verdict", "")
    )
    with connection.execute_wrapper(kept):
        page = operations_queue_for_user(
            user=root, filters=filters, after=None, limit=50, counted=True
        )
    assert page.rows
    ((sql, params),) = [(sql, params) for sql, params in statements if "recovery_operation" in sql]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert not re.search(r"Seq Scan on recovery_operation\b", plan), plan
    assert "operation_unsettled" in plan and "operation_stranded" in plan, plan


def test_verify_reads_the_log_in_batches_not_all_at_once(db, monkeypatch):
    """Memory stays flat: each statement reads one page of events, and a page is let go
    before the next is read."""
    import weakref

    from audit import verify_walk

    seed.seed_audit(120)
    pages: list[int] = []
    alive: list[int] = []
    held: list[weakref.ref[Any]] = []
    real = verify_walk.event_rows

    class Page(list):  # a list that a weak reference can follow
        pass

    def counting(fetched: list[tuple[Any, ...]]) -> Any:
        alive.append(sum(ref() is not None for ref in held))
        page = Page(fetched)
        held.append(weakref.ref(page))
        pages.append(len(page))
        return real(page)

    monkeypatch.setattr(verify_walk, "event_rows", counting)
    assert next(iter(audit_verify(chunk_size=10)), None) is None
    assert sum(pages) == 120 and max(pages) <= 10
    assert max(alive) <= 1  # at most the page before, being let go


@pytest.mark.django_db(transaction=True)
def test_benchmark_audit_checkpoints_then_verifies_in_processes_of_their_own(monkeypatch):
    # The processes it starts read this test's database.
    monkeypatch.setenv("DATABASE_URL", test_database_url())
    out = io.StringIO()
    call_command("benchmark_audit", events=200, new=40, stdout=out)
    figures = _figures(out)
    assert figures["events"] == 200
    assert figures["routine_checkpoint"]["new_events"] == 40
    assert figures["routine_checkpoint"]["output"].startswith("checkpoint #2: 10 chains")
    assert figures["full_verify"]["events"] == 240
    assert figures["full_verify"]["output"].startswith("newest checkpoint #2 signed")


def test_benchmark_signatures_verifies_a_signed_log_in_processes_of_their_own(
    monkeypatch, transactional_db
):
    # The processes it starts read this test's database.
    monkeypatch.setenv("DATABASE_URL", test_database_url())
    out = io.StringIO()
    call_command("benchmark_signatures", events=200, signed=0.1, repeat=1, votes=20, stdout=out)
    figures = _figures(out)
    assert figures["one_signed_decision"]["votes"] == 20
    # Ten passkey_added events, then 200 events of which 20 are signed votes.
    assert figures["signed_0"]["events"] == figures["signed_0.1"]["events"] == 210
    assert "10% signed: {" in out.getvalue()
    assert figures["ratio_work"] > 0 and figures["ratio_median"] > 0
