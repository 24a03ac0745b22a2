"""The one transition table and its compare-and-set."""

from __future__ import annotations

import pytest

from recovery.models import AuditEvent, Operation, State
from recovery.services import operation_register
from recovery.transitions import TRANSITIONS, Event, TransitionRefused, operation_transition
from tests.conftest import PARAMS

pytestmark = pytest.mark.django_db


@pytest.fixture
def operation(host, provider) -> Operation:
    operation, _ = operation_register(
        host=host, key="op-t", action="payment.send", provider_name="orders", params=PARAMS
    )
    return operation


def test_allowed_transition_bumps_version_and_is_audited(operation):
    operation_transition(operation=operation, event=Event.APPROVE, actor="test")
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
        operation_transition(operation=operation, event=Event.COMMIT, actor="test")
    assert refused.value.reason == "not allowed from this state"
    row = Operation.objects.get(pk=operation.pk)
    assert (row.state, row.version) == (State.AWAITING_APPROVAL, 1)
    assert not AuditEvent.objects.filter(kind="transition").exists()


def test_stale_version_is_refused_by_the_compare_and_set(operation):
    stale = Operation.objects.get(pk=operation.pk)
    operation_transition(operation=operation, event=Event.APPROVE, actor="first")
    with pytest.raises(TransitionRefused) as refused:
        operation_transition(operation=stale, event=Event.DENY, actor="late")
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
        (State.RECONCILE, Event.CONFIRM),
    }
