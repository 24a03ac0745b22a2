"""Opening an approval with a party and a link costs no statement more than opening
one without on PostgreSQL (the party's upsert rides in the approval's insert,
``approval.opened``'s outbox row in the events', ``audit_transaction_rider``). SQLite,
with no writing ``WITH``, pays both apart."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from common.actors import Actor
from policies.services import policy_apply
from tests.support.customers import PARTY, customer_policy_apply
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db(transaction=True)


def _opening(flow, key, body):
    flow.register(key, PARAMS)
    with CaptureQueriesContext(connection) as queries:
        response = flow.host_api.post(f"/api/v1/operations/{key}/approvals", body)
    assert response.status_code == 201, response.content
    return [query["sql"] for query in queries.captured_queries]


def test_a_party_and_its_link_cost_no_statement_more_on_postgresql(flow):
    policy_apply(source=b'[[rules]]\nname = "p"\noutcome = "person"\n', actor=Actor.system("t"))
    _opening(flow, "warm-1", None)  # this process reads the policy once
    without = _opening(flow, "op-1", None)
    customer_policy_apply()
    _opening(flow, "warm-2", {"party": PARTY})
    named = _opening(flow, "op-2", {"party": {**PARTY, "name": "Ada King"}})
    more = 0 if connection.vendor == "postgresql" else 2
    assert len(named) - len(without) == more, "\n".join(named)
    assert any("approvals_party" in sql for sql in named)
