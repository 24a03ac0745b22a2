"""A stranded receipt is one test (``recovery.models.receipt_stranded``): the queue, the
operation page and the decisions ask it, and the queue's statement agrees with it."""

from __future__ import annotations

import pytest

from recovery.models import Dispatch, State, receipt_stranded
from tests.support.console import client_for

RUNNING = Dispatch.ReceiptStatus.RUNNING


@pytest.mark.parametrize("state", [state for state in State if state != State.DISPATCHED])
def test_a_running_receipt_past_dispatched_is_stranded(state: State) -> None:
    assert receipt_stranded(state=state, receipt_status=RUNNING)
    assert not receipt_stranded(state=state, receipt_status=Dispatch.ReceiptStatus.SUCCEEDED)
    assert not receipt_stranded(state=state, receipt_status=None)


def test_a_running_receipt_of_a_dispatched_operation_is_not_stranded() -> None:
    # A worker still holds it, or will be found to have lost it (lease_lost).
    assert not receipt_stranded(state=State.DISPATCHED, receipt_status=RUNNING)


@pytest.mark.django_db
def test_the_operation_page_marks_a_stranded_receipt_and_not_one_in_flight(operator, stuck):
    stranded = stuck.unknown("op-1")
    page = client_for(operator).get(f"/operations/{stranded.key}/").content.decode()
    assert '<span class="badge stranded">stranded</span>' in page
    stuck.flow.approved("op-2")
    assert stuck.flow.dispatch("op-2").status_code == 200  # its worker holds it: dispatched
    live = client_for(operator).get("/operations/op-2/").content.decode()
    assert '<span class="badge stranded">stranded</span>' not in live
