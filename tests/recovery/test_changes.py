"""The core's changes: each batch handed to every registered recorder, in its transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection

from audit.chain import audit_transaction
from common.actors import COMMAND_LINE
from recovery import changes
from recovery.changes import OperationChange, changes_recorder_register
from recovery.models import Operation
from recovery.services.locking import operation_lock
from recovery.transitions import Event, TransitionRefused, operation_transition

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[OperationChange], bool]]:
    """Only this test's recorder: each batch it got, and whether a transaction was open."""
    monkeypatch.setattr(changes, "_recorders", [])
    batches: list[tuple[list[OperationChange], bool]] = []

    def recorder(batch: Sequence[OperationChange]) -> None:
        batches.append((list(batch), connection.in_atomic_block))

    changes_recorder_register(recorder)
    changes_recorder_register(recorder)  # once, however often
    return batches


def test_a_transition_is_handed_to_the_recorder_as_it_moved_in_its_transaction(
    flow: Any, recorded: list[tuple[list[OperationChange], bool]]
) -> None:
    flow.approved()
    (batch, in_transaction), *_ = [item for item in recorded if item[0][0].event == "approve"]
    assert in_transaction and len(batch) == 1
    (change,) = batch
    assert change.target == "approved" and change.operation.key == "op-1"
    assert change.operation.state == "approved"  # already moved when recorded


def test_a_transition_the_table_refuses_is_handed_to_nobody(
    flow: Any, recorded: list[tuple[list[OperationChange], bool]]
) -> None:
    flow.approved()
    before = len(recorded)
    with audit_transaction():
        operation = operation_lock(Operation.objects.get(key="op-1"))
        with pytest.raises(TransitionRefused):
            operation_transition(operation=operation, event=Event.CONFIRM, actor=COMMAND_LINE)
    assert len(recorded) == before


def test_an_empty_batch_is_handed_to_nobody(
    recorded: list[tuple[list[OperationChange], bool]],
) -> None:
    changes.changes_record([])
    assert recorded == []
