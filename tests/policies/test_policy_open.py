"""What a policy asks of an approval as a host opens it, and how people then decide it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approval, ApprovalVote
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of
from policies import services
from policies.models import BudgetUse
from policies.services import policy_apply
from recovery.models import Operation
from recovery.services.errors import RecoveryError
from recovery.services.permits import approval_decision
from tests.support.console import console_user
from tests.support.flow import PARAMS

POLICY = b"""
[[rules]]
name = "small"
provider = "orders"
when = ["/amount <= 2000"]
outcome = "approve"
reason = "small payments need nobody"

[rules.budget]
window = "24h"
count = 2
sum = "/amount"
limit = 3000

[[rules]]
name = "gbp"
when = ['/currency == "GBP"']
outcome = "deny"

[[rules]]
name = "two"
when = ["/amount >= 1000"]
outcome = "quorum"
approvals = 2
"""


@pytest.fixture
def policy(db):
    policy_apply(source=POLICY, actor=Actor.system("test"))


def _open(flow, key, params, **body):
    flow.register(key, params)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals", body or None)
    assert response.status_code == 201, response.content
    return response.json()


def _decide(user, opened, approve=True, digest=None, **more):
    approval = Approval.objects.get(pk=opened["approval_id"])
    return approval_decision(
        approval_id=approval.id,
        approve=approve,
        ttl_seconds=300,
        decided_by=Actor.of("user", user),
        reviewed_digest=digest or approval.params_digest,
        **more,
    )


def test_an_approve_rule_approves_at_once_naming_rule_and_version(flow, policy):
    opened = _open(flow, "op-1", {**PARAMS, "amount": 500})
    assert opened["status"] == "approved" and opened["permit_id"]
    assert opened["rule"] == "small" and opened["needed"] == ""
    approval = Approval.objects.get(pk=opened["approval_id"])
    assert approval.decided_by == Actor.system("policy")
    assert approval.policy_version.startswith("sha256:")
    requested = AuditEvent.objects.get(kind="approval_requested", operation_key="op-1")
    assert requested.data["rule"] == "small"
    assert requested.data["budget"] == {"budget": "small", "scope": "fleet-a", "amount": "500"}
    assert Operation.objects.get(key="op-1").state == "approved"
    dispatched = flow.dispatch("op-1", digest=digest_of({**PARAMS, "amount": 500}))
    assert dispatched.status_code == 200, dispatched.content


def test_a_deny_rule_denies_at_once(flow, policy):
    opened = _open(flow, "op-1", {**PARAMS, "currency": "GBP", "amount": 5000})
    assert opened["status"] == "denied" and opened["rule"] == "gbp"
    assert Operation.objects.get(key="op-1").state == "denied"


def test_no_rule_matched_asks_one_person_as_before(flow, policy):
    opened = _open(flow, "op-1", {**PARAMS, "amount": 900, "currency": "EUR"})
    # 900 fits "small", but its budget was not asked yet: it approves. 9000 matches "two".
    assert opened["status"] == "approved"
    opened = _open(flow, "op-2", {"amount": 50, "currency": "CHF", "to": "x"})
    assert opened["status"] == "approved"  # still the budget (count 2)
    opened = _open(flow, "op-3", {"amount": 50, "currency": "CHF", "to": "x"})
    assert (opened["status"], opened["rule"], opened["needed"]) == (
        "pending",
        "",
        "0 of 1 approvals",
    )


def test_what_the_budget_cannot_pay_falls_through_to_people(flow, policy):
    first = _open(flow, "op-1", {**PARAMS, "amount": 2000})
    assert first["status"] == "approved"
    # 2000 + 1500 passes the limit of 3000: the quorum rule decides instead.
    second = _open(flow, "op-2", {**PARAMS, "amount": 1500})
    assert (second["status"], second["rule"], second["needed"]) == (
        "pending",
        "two",
        "0 of 2 approvals",
    )
    third = _open(flow, "op-3", {**PARAMS, "amount": 1000})
    assert third["status"] == "approved"  # exactly the limit
    fourth = _open(flow, "op-4", {**PARAMS, "amount": 1})
    assert fourth["status"] == "pending"  # the count of 2 is spent


def test_a_budget_pays_again_once_its_window_has_passed(flow, policy):
    assert _open(flow, "op-1", {**PARAMS, "amount": 2000})["status"] == "approved"
    assert _open(flow, "op-2", {**PARAMS, "amount": 1500})["status"] == "pending"
    with time_machine.travel(timezone.now() + timedelta(hours=24, seconds=1)):
        assert _open(flow, "op-3", {**PARAMS, "amount": 1500})["status"] == "approved"


@pytest.fixture
def deciders(provider):
    return [console_user(name, "decide_approvals", provider) for name in ("ann", "ben", "cat")]


def test_a_quorum_counts_distinct_people_and_the_same_person_once(flow, policy, deciders):
    ann, ben, _ = deciders
    opened = _open(flow, "op-1", {**PARAMS, "amount": 9000})
    approval, permit = _decide(ann, opened)
    assert approval.status == "pending" and permit is None
    with pytest.raises(RecoveryError) as twice:
        _decide(ann, opened)
    assert twice.value.code == "already_voted"
    assert Approval.objects.get(pk=opened["approval_id"]).status == "pending"
    assert AuditEvent.objects.filter(kind="decision_refused", data__code="already_voted").exists()
    record = flow.approver_api.get(f"/api/v1/approvals/{opened['approval_id']}").json()
    assert (record["approvals"], record["needed"]) == (1, "1 of 2 approvals")
    approval, permit = _decide(ben, opened, reason="checked the invoice")
    assert approval.status == "approved" and permit is not None
    assert ApprovalVote.objects.filter(approval=approval).count() == 2
    assert Operation.objects.get(key="op-1").state == "approved"


def test_one_denial_denies_a_quorum(flow, policy, deciders):
    ann, ben, _ = deciders
    opened = _open(flow, "op-1", {**PARAMS, "amount": 9000})
    _decide(ann, opened)
    approval, _ = _decide(ben, opened, approve=False, reason="no invoice")
    assert approval.status == "denied"
    assert Operation.objects.get(key="op-1").state == "denied"


def test_the_proposer_never_decides(flow, policy, deciders):
    ann, _, _ = deciders
    opened = _open(flow, "op-1", {**PARAMS, "amount": 9000}, proposer="ann")
    with pytest.raises(RecoveryError) as refused:
        _decide(ann, opened)
    assert refused.value.code == "proposer_excluded"
    assert not ApprovalVote.objects.exists()


def test_a_proposer_on_a_one_person_approval_is_excluded_too(flow, deciders):
    ann, ben, _ = deciders
    opened = _open(flow, "op-1", PARAMS, proposer="ann")
    with pytest.raises(RecoveryError) as refused:
        _decide(ann, opened)
    assert refused.value.code == "proposer_excluded"
    approval, _ = _decide(ben, opened)
    assert approval.status == "approved"


GROUPS = b"""
[providers.orders]
passkey = "optional"

[[rules]]
name = "finance"
outcome = "person"
groups = ["finance"]

"""


def test_people_outside_the_named_groups_do_not_count(flow, deciders):
    policy_apply(source=GROUPS, actor=Actor.system("test"))
    ann, ben, _ = deciders
    Group.objects.create(name="finance").user_set.add(ben)
    opened = _open(flow, "op-1", PARAMS)
    with pytest.raises(RecoveryError) as refused:
        _decide(ann, opened)
    assert refused.value.code == "not_in_group"
    with pytest.raises(RecoveryError) as approver:
        flow_decision = flow.approver_api.post(
            f"/api/v1/approvals/{opened['approval_id']}/decision",
            {"decision": "approve", "params_digest": digest_of(PARAMS)},
        )
        assert flow_decision.status_code == 403
        assert flow_decision.json()["error"] == "not_in_group"
        raise RecoveryError(flow_decision.json()["error"], "")
    assert approver.value.code == "not_in_group"
    approval, _ = _decide(ben, opened)
    assert approval.status == "approved"


def test_a_provider_that_requires_a_passkey_refuses_an_unsigned_decision(flow, deciders):
    policy_apply(source=b'[providers.orders]\npasskey = "required"\n', actor=Actor.system("t"))
    opened = _open(flow, "op-1", PARAMS)
    with pytest.raises(RecoveryError) as refused:
        _decide(deciders[0], opened)
    assert refused.value.code == "passkey_required"
    assert Approval.objects.get(pk=opened["approval_id"]).status == "pending"
    response = flow.approver_api.post(
        f"/api/v1/approvals/{opened['approval_id']}/decision",
        {"decision": "approve", "params_digest": digest_of(PARAMS)},
    )
    assert (response.status_code, response.json()["error"]) == (403, "passkey_required")


def test_policy_apply_records_old_and_new_and_check_names_the_line(tmp_path, db, capsys):
    good = tmp_path / "policy.toml"
    good.write_bytes(POLICY)
    call_command("policy", "check", str(good))
    assert "3 rules" in capsys.readouterr().out
    call_command("policy", "apply", str(good), "--yes")
    out = capsys.readouterr().out
    assert '+name = "small"' in out and "applied sha256:" in out
    changed = tmp_path / "changed.toml"
    changed.write_bytes(POLICY.replace(b"count = 2", b"count = 3"))
    call_command("policy", "apply", str(changed), "--yes")
    out = capsys.readouterr().out
    assert "-count = 2" in out and "+count = 3" in out
    applied = AuditEvent.objects.filter(kind="policy_applied").order_by("seq")
    assert [event.data["new"] for event in applied] == [POLICY.decode(), changed.read_text()]
    assert applied[1].data["old"] == POLICY.decode()
    call_command("policy", "apply", str(changed), "--yes")
    assert "already in force" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_bytes(POLICY.replace(b'outcome = "deny"', b'outcome = "nope"'))
    with pytest.raises(CommandError, match=r"bad.toml: line 18: outcome must be"):
        call_command("policy", "apply", str(bad), "--yes")
    assert AuditEvent.objects.filter(kind="policy_applied").count() == 2


@pytest.fixture
def paying_last(monkeypatch):
    """No budget paid first in this process because of an earlier test's."""
    monkeypatch.setattr(services, "_paid_first_until", {})


def _statements(work):
    with CaptureQueriesContext(connection) as queries:
        work()
    return [q["sql"] for q in queries.captured_queries]


def _budget_statements(sql):
    """Where the budget's lock and its use come in the opening's statements, and the
    statements after the use."""
    lock = next(i for i, s in enumerate(sql) if "policies_budgetlock" in s)
    use = next(i for i, s in enumerate(sql) if "policies_budgetuse" in s)
    return lock, use, sql[use + 1 :]


def test_an_opening_pays_its_budget_last_after_its_approval_and_its_events(
    flow, policy, paying_last
):
    flow.register("op-1", {**PARAMS, "amount": 500})
    sql = _statements(lambda: _open_only(flow, "op-1"))
    lock, use, after = _budget_statements(sql)
    events = next(i for i, s in enumerate(sql) if 'INSERT INTO "audit_auditevent"' in s)
    # The lock taken by the events' own statement (a statement before it on SQLite, which
    # has no writing WITH), the use the statement after them, then the commit.
    assert lock == events if connection.vendor == "postgresql" else lock < events
    assert use == events + 1
    # The permit the policy issued rides with them too (a statement before them on SQLite).
    permit = next(i for i, s in enumerate(sql) if 'INSERT INTO "approvals_permit"' in s)
    assert permit == events if connection.vendor == "postgresql" else permit < events
    assert [s for s in after if "SAVEPOINT" not in s] == []
    assert BudgetUse.objects.get().amount == 500


def test_what_the_budget_cannot_pay_last_runs_again_paying_first_and_the_next_rule_decides(
    flow, policy, paying_last
):
    assert _open(flow, "op-1", {**PARAMS, "amount": 2000})["status"] == "approved"
    flow.register("op-2", {**PARAMS, "amount": 1500})
    sql = _statements(lambda: _open_only(flow, "op-2"))
    # Paid last, it could not pay: everything rolled back and ran again, paying first.
    locks = [i for i, s in enumerate(sql) if "policies_budgetlock" in s]
    assert len(locks) == 2
    rollback = next(i for i, s in enumerate(sql) if "ROLLBACK" in s)
    assert locks[0] < rollback < locks[1] < _approval_inserted(sql, after=rollback)
    approval = Approval.objects.get(operation_key="op-2")
    assert (approval.status, approval.rule) == ("pending", "two")
    assert AuditEvent.objects.filter(kind="approval_requested", operation_key="op-2").count() == 1
    assert [use.amount for use in BudgetUse.objects.all()] == [2000]
    # Spent, it is paid first for a while: the next opening runs once.
    flow.register("op-3", {**PARAMS, "amount": 1000})
    sql = _statements(lambda: _open_only(flow, "op-3"))
    lock, use, _ = _budget_statements(sql)
    assert [i for i, s in enumerate(sql) if "policies_budgetlock" in s] == [lock]
    assert use == lock + 1  # paid first: the use right after the lock
    assert lock < _approval_inserted(sql, after=0)
    assert Approval.objects.get(operation_key="op-3").status == "approved"  # exactly 3000


def _approval_inserted(sql, *, after):
    return next(i for i, s in enumerate(sql) if i > after and 'INTO "approvals_approval"' in s)


def _open_only(flow, key):
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals", None)
    assert response.status_code == 201, response.content


def test_register_open_and_dispatch_run_again_answer_for_the_run_that_committed(
    flow, policy, paying_last
):
    assert _open(flow, "op-1", {**PARAMS, "amount": 2000})["status"] == "approved"
    params = {**PARAMS, "amount": 1500}
    response = flow.host_api.post(
        "/api/v1/operations",
        {
            "key": "op-2",
            "action": "payment.send",
            "provider": "orders",
            "params": params,
            "approval": {},
            "dispatch": {"worker": "w", "params_digest": digest_of(params)},
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    # Paid last, the budget could not pay: the answer is the second run's, a person's.
    assert (body["approval"]["status"], body["approval"]["rule"]) == ("pending", "two")
    assert "dispatch" not in body and "dispatch_refused" not in body
    assert body["approval"]["approval_id"] == str(Approval.objects.get(operation_key="op-2").pk)
    assert Operation.objects.get(key="op-2").state == "awaiting_approval"


def test_the_budgets_paid_first_are_remembered_up_to_a_bound(flow, policy, monkeypatch):
    monkeypatch.setattr(services, "PAID_FIRST_MAX", 2)
    monkeypatch.setattr(services, "_paid_first_until", {("a", "x"): 0.0, ("b", "x"): 0.0})
    assert _open(flow, "op-1", {**PARAMS, "amount": 2000})["status"] == "approved"
    assert _open(flow, "op-2", {**PARAMS, "amount": 1500})["status"] == "pending"
    assert list(services._paid_first_until) == [("small", "fleet-a")]
