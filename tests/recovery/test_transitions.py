"""The one transition table and its compare-and-set."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from audit.chain import audit_transaction
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from common.actors import Actor
from recovery.models import Operation, State
from recovery.services.locking import operation_lock
from recovery.services.registration import operation_register
from recovery.transitions import TRANSITIONS, Event, TransitionRefused, operation_transition
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


@pytest.fixture
def operation(host, provider) -> Operation:
    operation, _ = operation_register(
        host=host, key="op-t", action="payment.send", provider_name="orders", params=PARAMS
    )
    return operation


def transition(operation: Operation, event: str, who: str) -> None:
    """One transition in its own audited transaction, the way services make them."""
    with audit_transaction():
        operation_transition(operation=operation, event=event, actor=Actor.system(who))


def test_allowed_transition_bumps_version_and_is_audited(operation):
    transition(operation_lock(operation), Event.APPROVE, "test")
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.APPROVED, 2)
    event = AuditEvent.objects.filter(kind="transition").get()
    assert event.data == {
        "event": "approve",
        "from": "awaiting_approval",
        "to": "approved",
        "version": 2,
    }


def test_transition_not_in_the_table_is_refused_and_changes_nothing(operation):
    with pytest.raises(TransitionRefused) as refused:
        transition(operation_lock(operation), Event.COMMIT, "test")
    assert refused.value.reason == "not allowed from this state"
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.AWAITING_APPROVAL, 1)
    assert not AuditEvent.objects.filter(kind="transition").exists()


def test_stale_version_is_refused_by_the_compare_and_set(operation):
    stale = operation_lock(operation)
    transition(operation_lock(operation), Event.APPROVE, "first")
    with pytest.raises(TransitionRefused) as refused:
        transition(stale, Event.DENY, "late")
    assert refused.value.reason == "stale (state, version)"
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.APPROVED, 2)


def test_terminal_states_have_no_way_out_except_failed_to_reconcile():
    outgoing = {state for state, _ in TRANSITIONS}
    assert (
        outgoing & {State.RELEASED, State.VOIDED, State.DENIED, State.EXPIRED, State.REVOKED}
        == set()
    )
    assert {event for state, event in TRANSITIONS if state == State.FAILED} == {Event.CONFLICT}


def test_only_evidence_or_an_operator_releases_an_uncertain_operation():
    into_released = {
        (state, event)
        for (state, event), target in TRANSITIONS.items()
        if target == State.RELEASED and state in (State.UNKNOWN, State.RECONCILE)
    }
    assert into_released == {
        (State.UNKNOWN, Event.EVIDENCE_MATCH),
        (State.RECONCILE, Event.EVIDENCE_MATCH),
        (State.UNKNOWN, Event.CONFIRM),
        (State.RECONCILE, Event.CONFIRM),
    }


def test_a_service_whose_transition_is_refused_records_it_and_raises_stale_state(flow):
    """Any caller — the API, a task, a console view — gets the same coded refusal."""
    from approvals.models import Approval, Approver
    from harness.providers import digest_of
    from recovery.services.errors import RecoveryError
    from recovery.services.permits import approval_decision

    flow.register("op-s")
    approval_id = flow.host_api.post("/api/v1/operations/op-s/approvals").json()["approval_id"]
    Operation.objects.filter(key="op-s").update(state=State.EXPIRED)
    with pytest.raises(RecoveryError) as refused:
        approval_decision(
            approval_id=approval_id,
            approve=True,
            ttl_seconds=60,
            decided_by=Actor.of("approver", Approver.objects.get(name="alice-phone")),
            reviewed_digest=digest_of(PARAMS),
        )
    assert (refused.value.code, refused.value.extra) == ("stale_state", {"state": "expired"})
    signal = AuditEvent.objects.get(kind="stale_signal")
    assert (str(signal.actor), signal.data["signal"]) == (
        "approver:alice-phone",
        "transition_refused",
    )
    assert Approval.objects.get(pk=approval_id).status == "pending"


postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="a transition rides with the events' statement on PostgreSQL alone",
)


def _ride(operation: Operation, *events: str) -> list[str]:
    """``events`` riding, in one audited transaction; the statements it ran."""
    with CaptureQueriesContext(connection) as queries, audit_transaction():
        locked = operation_lock(operation)
        for event in events:
            operation_transition(
                operation=locked, event=event, actor=Actor.system("test"), riding=True
            )
    return [query["sql"] for query in queries.captured_queries]


@postgres_only
def test_transitions_riding_are_one_compare_and_set_in_the_events_statement(operation):
    statements = _ride(operation, Event.APPROVE, Event.REVOKE)
    moves = [sql for sql in statements if 'UPDATE "recovery_operation"' in sql]
    assert len(moves) == 1 and "INSERT INTO" in moves[0], "\n".join(statements)
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.REVOKED, 3)
    last = AuditEvent.objects.filter(operation_key=row.key).latest("seq")
    assert (row.audit_seq, row.audit_hash) == (last.seq, last.hash)
    assert [e.data["to"] for e in AuditEvent.objects.filter(kind="transition")] == [
        "approved",
        "revoked",
    ]
    assert list(audit_verify()) == []


@postgres_only
def test_a_riding_transition_whose_row_moved_under_it_rolls_everything_back(operation):
    moved = pytest.raises(RuntimeError, match="was not at awaiting_approval v1")
    with moved, audit_transaction():
        locked = operation_lock(operation)
        operation_transition(
            operation=locked, event=Event.APPROVE, actor=Actor.system("test"), riding=True
        )
        # A writer that broke the rule (wrote the row after a transition that rides).
        Operation.objects.filter(pk=operation.pk).update(version=F("version") + 1)
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.AWAITING_APPROVAL, 1)
    assert not AuditEvent.objects.filter(kind="transition").exists()


@postgres_only
def test_a_riding_transition_of_a_block_rolled_back_goes_with_it(operation):
    with audit_transaction():
        locked = operation_lock(operation)
        with pytest.raises(ZeroDivisionError), audit_transaction():
            operation_transition(
                operation=locked, event=Event.APPROVE, actor=Actor.system("test"), riding=True
            )
            1 / 0  # noqa: B018
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.AWAITING_APPROVAL, 1)
    assert not AuditEvent.objects.filter(kind="transition").exists()
