"""Each host-API call costs a bounded number of SQL statements, BEGIN/COMMIT included.

Statement counts do not depend on the machine, so they are tested here; latency and
throughput are in ``bench/api.py``. The budget is the fleet's: at most 8 statements per
call, on the paths a healthy fleet takes all day and on resume after a crash.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models.sql.compiler import (
    SQLCompiler,
    SQLDeleteCompiler,
    SQLInsertCompiler,
    SQLUpdateCompiler,
)
from django.test.utils import CaptureQueriesContext

from common.actors import Actor
from harness.providers import digest_of
from policies.services import policy_apply, policy_current
from recovery.models import Dispatch
from tests.support.flow import PARAMS, lookup_due, queued_lookups_run, register_body

pytestmark = pytest.mark.django_db(transaction=True)

BUDGET = 8
# On PostgreSQL a call's webhook outbox rides with the transaction's events, in their
# statement (``audit_transaction_rider``). SQLite has no writing WITH: it is a statement
# of its own there.
RIDES = connection.vendor == "postgresql"
APART = 0 if RIDES else 1  # a write that rides there: a statement of its own on SQLite
# A call whose change a host may subscribe to (an approval decided, a release, a failure)
# also writes the webhook outbox in its transaction: one INSERT … SELECT, whether or not
# the host has endpoints (knowing that would cost the same); riding, no statement.
WEBHOOK_OUTBOX = APART
# A transition that nothing after it in its transaction reads rides with the events too
# (``recovery.transitions``: a decision's, a dispatch's, a report's), the chain's head
# with it; a statement of its own on SQLite.
TRANSITION_APART = APART
# A host's report: BEGIN, the operation locked, its dispatch with the clock, the events
# (the outbox, the receipt and the operation's move, told the receipt is complete,
# riding), COMMIT.
REPORT = 5 + WEBHOOK_OUTBOX + APART + TRANSITION_APART  # the receipt
# An opening moves the operation's chain head without a transition to write it with: on
# PostgreSQL it rides in the events' statement, a statement of its own on SQLite.
HEAD_APART = APART
# Opening an approval: BEGIN, the operation locked, an approval open of it looked for, the
# policy version in force (exact, never a cached guess: one short statement), the
# approval's INSERT, its event (the chain's head riding), COMMIT.
OPEN_APPROVAL = 7 + HEAD_APART
# A dispatch: BEGIN, the operation locked, the permit consumed, the events (the
# dispatch's row, the operation's move and the webhook outbox riding), COMMIT.
DISPATCH = 5 + WEBHOOK_OUTBOX + APART + TRANSITION_APART  # the dispatch's row
# A decision, the approver's first call: its credential found, BEGIN, the operation
# locked (bound to the approval), the approval decided (compare-and-set), the events
# (the permit's INSERT and the operation's move, which nothing after the decision reads,
# and the webhook outbox riding), COMMIT.
APPROVE = 6 + WEBHOOK_OUTBOX + APART + TRANSITION_APART  # the permit
# A registration finds its provider by name in its operation's INSERT on PostgreSQL
# (``dbsql.writes.insert_naming``), with a SELECT of its own before it on SQLite.
PROVIDER_APART = APART


def _cost(call: Any) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = call()
    return response, [query["sql"] for query in queries.captured_queries]


def _within_budget(name: str, call: Any, budget: int = BUDGET, expect: int = 0) -> Any:
    response, statements = _cost(call)
    if expect:
        assert response.status_code == expect, response.content
    else:
        assert response.status_code < 300, response.content
    listing = "\n".join(statements)
    assert len(statements) <= budget, f"{name}: {len(statements)} statements\n{listing}"
    return response


def test_the_lifecycle_calls_stay_within_the_budget(host_api, approver_api, provider):
    def post(api: Any, path: str, body: dict[str, Any] | None = None) -> Any:
        return lambda: api.post(path, body)

    _within_budget(
        "register",
        post(
            host_api,
            "/api/v1/operations",
            {"key": "op-1", "action": "payment.send", "provider": "orders", "params": PARAMS},
        ),
    )
    approval = _within_budget(
        "open approval",
        post(host_api, "/api/v1/operations/op-1/approvals"),
        OPEN_APPROVAL,
    )
    decision = _within_budget(
        "approve (writes the webhook outbox)",
        post(
            approver_api,
            f"/api/v1/approvals/{approval.json()['approval_id']}/decision",
            {"decision": "approve", "ttl_seconds": 300, "params_digest": digest_of(PARAMS)},
        ),
        APPROVE,
    )
    dispatched = _within_budget(
        "dispatch",
        post(
            host_api,
            "/api/v1/operations/op-1/dispatch",
            {"worker": "w1", "params_digest": digest_of(PARAMS)},
        ),
        DISPATCH,
    )
    token = dispatched.json()["fencing_token"]
    _within_budget(
        "heartbeat", post(host_api, "/api/v1/operations/op-1/heartbeat", {"fencing_token": token})
    )
    _within_budget(
        "report (writes the webhook outbox)",
        post(
            host_api,
            "/api/v1/operations/op-1/result",
            {"fencing_token": token, "outcome": "committed"},
        ),
        REPORT,
    )
    _within_budget(
        "resume (settled)", post(host_api, "/api/v1/operations/op-1/resume", {"worker": "w2"})
    )
    _within_budget(
        "dispatch refused (already consumed)",
        post(
            host_api,
            "/api/v1/operations/op-1/dispatch",
            {"worker": "w3", "params_digest": digest_of(PARAMS)},
        ),
        expect=409,
    )
    _within_budget(
        "revoke (consumed)",
        post(
            host_api, f"/api/v1/permits/{decision.json()['permit_id']}/revoke", {"reason": "late"}
        ),
    )


def test_revoking_an_active_permit_stays_within_the_budget(flow, host_api):
    permit_id = flow.approved()["permit_id"]
    _within_budget(
        "revoke (active)",
        lambda: host_api.post(f"/api/v1/permits/{permit_id}/revoke", {"reason": "no"}),
    )


def test_every_resume_stays_within_the_budget(flow, host_api, provider):
    def resume() -> Any:
        return host_api.post("/api/v1/operations/op-1/resume", {"worker": "w2"})

    def answered(name: str) -> dict[str, Any]:
        return dict(_within_budget(name, resume).json())

    flow.register()
    assert answered("resume (awaiting approval)")["decision"] == "wait"
    flow.approve()
    assert answered("resume (approved: dispatch)")["decision"] == "dispatch"
    live = answered("resume (live lease)")
    assert live["decision"] == "in_progress" and live["retry_after"] >= 1
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    crashed = answered("resume after a crash (lease lapsed, lookup queued)")
    assert crashed == {
        "decision": "in_progress",
        "state": "unknown",
        "recovered": False,
        "retry_after": 1,
    }
    assert answered("resume (lookup in flight)")["decision"] == "in_progress"
    assert queued_lookups_run() == 1  # the provider holds nothing: still unknown
    waiting = answered("resume (next lookup not due)")
    assert waiting["decision"] == "unknown" and waiting["retry_after"] >= 1
    lookup_due("op-1")
    assert answered("resume (lookup due, queued)")["decision"] == "in_progress"


# Registering with ``approval`` asked opens a new operation's approval in the
# registration's transaction: the token's lookup; BEGIN, the operation's INSERT (the
# provider found by it; no approval of it can be open: none is looked for), the policy in
# force, one INSERT of both events (the approval's INSERT, which nothing else reads before
# the commit, and the chain's head moved in the operation's row riding with it on
# PostgreSQL), COMMIT. No lock and no transaction of the opening's own: the row is the
# transaction's, unseen by any other until it ends.
REGISTER_AND_OPEN = 6 + PROVIDER_APART + HEAD_APART + APART  # the approval


def test_registering_and_opening_in_one_request_stays_within_both_budgets(host_api, provider):
    body = register_body(approval={})
    response = _within_budget(
        "register and open",
        lambda: host_api.post("/api/v1/operations", body),
        REGISTER_AND_OPEN,
        expect=201,
    )
    assert response.json()["approval"]["status"] == "pending"


def _approved_and_dispatched(host_api: Any, approver_api: Any, body: dict[str, Any]) -> str:
    """Register and open (``body``), a person's approval, the dispatch: its fencing token."""
    approval = host_api.post("/api/v1/operations", {**body, "approval": {}}).json()["approval"]
    approver_api.post(
        f"/api/v1/approvals/{approval['approval_id']}/decision",
        {"decision": "approve", "ttl_seconds": 300, "params_digest": digest_of(PARAMS)},
    )
    dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
    held = host_api.post(f"/api/v1/operations/{body['key']}/dispatch", dispatch)
    return str(held.json()["fencing_token"])


def test_the_lifecycle_costs_no_statement_for_credentials_already_found(
    host_api, approver_api, provider, settings
):
    """Each credential is looked up once (``SETTLE_CREDENTIAL_CACHE_SECONDS``): the
    lifecycle's five requests then cost the services' statements alone."""
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 60
    host_api.get("/api/v1/operations/warm")  # each token found once
    approver_api.get("/api/v1/approvals/00000000-0000-0000-0000-000000000000")
    with CaptureQueriesContext(connection) as queries:
        token = _approved_and_dispatched(host_api, approver_api, register_body("op-1"))
        reported = host_api.post(
            "/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "committed"}
        )
    assert reported.json()["state"] == "released"
    listing = "\n".join(query["sql"] for query in queries.captured_queries)
    assert "token_hash" not in listing
    # The lifecycle's 41 statements at 81c1a7e (bench/api.py) less its five credential
    # lookups, less the opening's transaction, lock, audit INSERT and search for an
    # approval already open of its own; on PostgreSQL less two outbox INSERTs and the
    # opening's head UPDATE, the approval, the permit, the dispatch's row, the report's
    # receipt and the three transitions (riding) and the provider's lookup (in the INSERT).
    assert len(queries.captured_queries) <= (20 if RIDES else 31), (
        f"{len(queries.captured_queries)}\n{listing}"
    )


# Where a policy approves the opening, registering with ``dispatch`` asked is one
# transaction (the token found before): BEGIN, the operation's INSERT (the provider found
# by it), the policy in force, the approval made and decided, one INSERT of every event
# (the permit, written already consumed, the dispatch's row, the operation's two moves in
# one UPDATE with the chain's head, the webhook outbox and the lock of the policy's
# budget riding with it), the budget's use (paid last), COMMIT.
# (the permit, the budget's lock, the dispatch's row and each move apart on SQLite)
REGISTER_OPEN_AND_DISPATCH = 8 + PROVIDER_APART + WEBHOOK_OUTBOX + 3 * APART + 2 * TRANSITION_APART
PAID_BY_BUDGET = b"""
[[rules]]
name = "agents"
provider = "orders"
action = "payment.send"
outcome = "approve"

[rules.budget]
window = "24h"
count = 1000
sum = "/amount"
limit = 100000000
"""
# ... and the report after it: the policy-approved lifecycle, in two requests.
POLICY_APPROVED_LIFECYCLE = REGISTER_OPEN_AND_DISPATCH + REPORT


def test_a_policy_approved_lifecycle_in_two_requests_stays_within_its_budget(
    host_api, provider, settings
):
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 60
    policy_apply(source=PAID_BY_BUDGET, actor=Actor.system("test"))
    body = {
        "key": "op-1",
        "action": "payment.send",
        "provider": "orders",
        "params": PARAMS,
        "approval": {},
        "dispatch": {"worker": "w1", "params_digest": digest_of(PARAMS)},
    }
    # The token found, the policy in force read: once per process, not per lifecycle.
    assert host_api.post("/api/v1/operations", {**body, "key": "op-0"}).status_code == 201
    with CaptureQueriesContext(connection) as queries:
        held = _within_budget(
            "register, open and dispatch",
            lambda: host_api.post("/api/v1/operations", body),
            REGISTER_OPEN_AND_DISPATCH,
            expect=201,
        ).json()["dispatch"]
        reported = _within_budget(
            "report",
            lambda: host_api.post(
                "/api/v1/operations/op-1/result",
                {"fencing_token": held["fencing_token"], "outcome": "committed"},
            ),
            REPORT,
        )
    assert reported.json()["state"] == "released"
    listing = "\n".join(query["sql"] for query in queries.captured_queries)
    assert len(queries.captured_queries) <= POLICY_APPROVED_LIFECYCLE, listing


def test_the_lifecycles_build_no_statement_through_the_orm(
    host_api, approver_api, provider, settings, monkeypatch
):
    """Every statement of both lifecycles is a kept text (``dbsql``): a queryset compiled
    on this path costs the web worker more CPU than PostgreSQL spends running it."""
    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 60
    policy_apply(source=PAID_BY_BUDGET, actor=Actor.system("test"))  # payment.send only
    policy_current()  # its rules read once per process
    host_api.get("/api/v1/operations/warm")  # each token found once
    approver_api.get("/api/v1/approvals/00000000-0000-0000-0000-000000000000")
    compiled: list[str] = []

    def counted(kind: type[SQLCompiler]) -> Any:
        original = kind.__dict__["as_sql"]

        def as_sql(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
            sql, params = original(self, *args, **kwargs)
            compiled.append(f"{kind.__name__}: {sql}")
            return sql, params

        return as_sql

    for kind in (SQLCompiler, SQLInsertCompiler, SQLUpdateCompiler, SQLDeleteCompiler):
        monkeypatch.setattr(kind, "as_sql", counted(kind))
    _both_lifecycles(host_api, approver_api, "")
    assert compiled == [], "\n".join(compiled)


def _both_lifecycles(host_api: Any, approver_api: Any, suffix: str) -> None:
    """A person-approved lifecycle (register and open, approve, dispatch, report) of
    ``op-p<suffix>`` and a policy-approved one (register, open and dispatch; report) of
    ``op-q<suffix>``, under ``PAID_BY_BUDGET`` applied: both released."""
    body = {**register_body(f"op-p{suffix}"), "action": "refund.send"}
    results = [(f"op-p{suffix}", _approved_and_dispatched(host_api, approver_api, body))]
    dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
    held = host_api.post(
        "/api/v1/operations", register_body(f"op-q{suffix}", approval={}, dispatch=dispatch)
    ).json()["dispatch"]
    results.append((f"op-q{suffix}", held["fencing_token"]))
    for key, token in results:
        reported = host_api.post(
            f"/api/v1/operations/{key}/result", {"fencing_token": token, "outcome": "committed"}
        )
        assert reported.json()["state"] == "released"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's conversion, PostgreSQL")
def test_no_statement_of_the_lifecycles_is_converted_anew_on_each_call(
    host_api, approver_api, provider, settings, monkeypatch
):
    """psycopg converts a text (``%s`` to ``$1``…) once and keeps it, up to the bounds
    ``settle.postgresql.base`` raises: the events' INSERT carrying an approval's row has
    51 parameters, one more than psycopg keeps by itself."""
    from psycopg import _queries

    settings.SETTLE_CREDENTIAL_CACHE_SECONDS = 60
    policy_apply(source=PAID_BY_BUDGET, actor=Actor.system("test"))  # payment.send only
    _both_lifecycles(host_api, approver_api, "0")  # each text converted for the first time
    anew: list[bytes] = []
    convert = _queries._query2pg_nocache

    def counted(query: bytes, *args: Any) -> Any:
        anew.append(bytes(query))
        return convert(query, *args)

    monkeypatch.setattr(_queries, "_query2pg_nocache", counted)
    _both_lifecycles(host_api, approver_api, "1")
    assert anew == [], b"\n".join(anew).decode()
