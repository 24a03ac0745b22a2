"""The lock every host call takes finds its row through the key, whatever the statistics."""

from __future__ import annotations

import pytest
from django.db import connection

from dbsql.rows import select_locked_with_sql
from recovery.models import Operation

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
]


def test_the_host_lock_uses_the_key_index_in_a_plan_made_before_any_analyze():
    """Prepared statements keep their generic plan: one made on an empty, unanalyzed table
    must still go through the unique key, not read every operation of the host (which
    made each call's cost grow with the host's operations, 0.55 -> 1.07 ms of PostgreSQL
    CPU over 52,500 calls on one connection)."""
    table = Operation._meta.db_table
    # A copy with the same indexes and no statistics: an ANALYZE an earlier test ran on
    # this database (the benchmarks' seeding does) must not decide the plan.
    sql = (
        select_locked_with_sql(Operation, "provider")
        .format(where="t.host_id = $1 AND t.key = $2")
        .replace(f'"{table}"', "unanalyzed_operation")
        .replace(f"{table} ", "unanalyzed_operation ")
    )
    assert "unanalyzed_operation" in sql, sql
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE unanalyzed_operation (LIKE {table} INCLUDING ALL)")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE settle_lock_plan AS {sql}")
        cursor.execute("EXPLAIN EXECUTE settle_lock_plan(1, 'op-1')")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE settle_lock_plan")
    assert "Index Cond: ((key)::text = $2)" in plan, plan
    assert "host_id" not in plan.split("Filter:")[0], plan
