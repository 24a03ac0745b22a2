"""A host that keeps asking for a consumed permit: every refusal is told and kept, in
bounded volume (the first N a minute one by one, the rest counted in one summary line)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from approvals.models import PermitEvent
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.verify_walk import audit_verify

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 9, 0, 5, tzinfo=UTC)


def _refused(flow, times: int) -> None:
    for _ in range(times):
        response = flow.dispatch(worker="again")
        assert response.status_code == 409, response.content
        assert response.json()["error"] == "already_consumed"  # told every time


def _refusal_lines() -> list[PermitEvent]:
    return list(PermitEvent.objects.filter(kind=PermitEvent.Kind.REFUSED).order_by("id"))


def _refusal_audit() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=AuditKind.CONSUME_REFUSED).order_by("seq"))


def test_refusals_past_the_limit_are_counted_in_one_summary_line(flow, settings):
    settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE = 3
    with time_machine.travel(START, tick=False):
        flow.approved()
        assert flow.dispatch().status_code == 200
        _refused(flow, 50)
    lines = _refusal_lines()
    assert len(lines) == 4
    assert [line.detail.get("count") for line in lines] == [None, None, None, 47]
    assert lines[3].detail["window_start"] == "2026-03-02T09:00:00+00:00"
    events = _refusal_audit()
    assert len(events) == 4  # three one by one, one when the summary opened
    assert events[3].data["summary_until"] == "2026-03-02T09:01:00+00:00"


def test_the_next_window_starts_afresh_and_closes_the_summary_on_the_chain(flow, settings):
    settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE = 2
    with time_machine.travel(START, tick=False) as clock:
        flow.approved()
        assert flow.dispatch().status_code == 200
        _refused(flow, 10)
        clock.shift(timedelta(minutes=1))
        _refused(flow, 3)
    lines = _refusal_lines()
    assert [line.detail.get("count") for line in lines] == [None, None, 8, None, None, 1]
    assert lines[2].detail["closed"] is True
    counted = [e.data for e in _refusal_audit() if "counted" in e.data]
    assert counted == [
        {
            "code": "already_consumed",
            "permit_id": str(lines[0].permit_id),
            "counted": 8,
            "first_at": lines[2].detail["first_at"],
            "last_at": lines[2].detail["last_at"],
            "permit_event_id": lines[2].pk,
        }
    ]
    assert list(audit_verify()) == []
