"""The queue's counts read their partial indexes in no order, whatever sample ANALYZE drew."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from bench import seed
from common.actors import Actor
from recovery.models import Provider
from recovery.selectors.queue import operations_queue_counts_for_user
from recovery.services.roles import role_grant, roles_ensure

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
]

# The indexes whose predicates are the counts' own conditions, and the one that finds
# a provider's operations in a state (an operator's counts may start from its providers).
COUNT_INDEXES = {
    "operation_lookup_due",
    "operation_unsettled",
    "operation_stranded",
    "operation_provider_state",
}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of the plan but those of the WITH clause naming an operator's
    providers (the permissions' own read, which counts no operation)."""
    yield plan
    for child in plan.get("Plans", ()):
        if not child.get("Subplan Name", "").startswith("CTE "):
            yield from _nodes(child)


def _reads_operations(node: dict[str, Any]) -> bool:
    """Whether the node reads the operations or their dispatches, itself or below."""
    if node.get("Relation Name") in {"recovery_operation", "recovery_dispatch"}:
        return True
    return any(_reads_operations(child) for child in node.get("Plans", ()))


def _counts_plan(user: Any) -> dict[str, Any]:
    statements: list[tuple[str, Any]] = []

    def kept(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kept):
        operations_queue_counts_for_user(user=user)
    ((sql, params),) = [(s, p) for s, p in statements if "recovery_operation" in s]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (found,) = cursor.fetchone()
    document = json.loads(found) if isinstance(found, str) else found
    return document[0]["Plan"]


@pytest.mark.parametrize("viewer", ["superuser", "operator"])
def test_the_queue_counts_never_sort_and_read_their_partial_indexes(viewer):
    """Each count stops at its cap only if it is read in no particular order: given an
    ORDER BY, the planner (which estimates that a row-by-row receipt check passes one
    row in 200) read every ``unknown`` operation along ``operation_lookup_due`` and
    sorted them all before the LIMIT (153 of 163 ms at 1M). Statistics drawn from a
    900-row sample, five times over, stand in for whatever sample a production ANALYZE
    draws: under none of them may a count sort, or read the operations table itself."""
    seed.seed_operations(4000)
    if viewer == "superuser":
        user = User.objects.create_superuser("root", "", "unused-pw-0123")
    else:
        user = User.objects.create_user("operator", "", "unused-pw-0123")
        roles_ensure()
        provider = Provider.objects.get(name=seed.PROVIDERS[0])
        role_grant(user=user, role="operator", provider=provider, actor=Actor.system("test"))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL default_statistics_target = 3")
    for _ in range(5):
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE recovery_operation")
            cursor.execute("ANALYZE recovery_dispatch")
        plan = _counts_plan(user)
        nodes = list(_nodes(plan))
        text = json.dumps(plan, indent=1)
        # An operator's few providers may be sorted for a join; no operation may be.
        sorts = [n for n in nodes if "Sort" in n["Node Type"] and _reads_operations(n)]
        assert not sorts, text
        scans = [n for n in nodes if n.get("Relation Name") == "recovery_operation"]
        assert all(n["Node Type"] != "Seq Scan" for n in scans), text
        read = {
            n["Index Name"]
            for n in nodes
            if n.get("Index Name", "").startswith(("operation_", "recovery_operation"))
        }
        assert read and read <= COUNT_INDEXES, text
