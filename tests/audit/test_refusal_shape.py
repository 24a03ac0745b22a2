"""Refusals on the audit log: one recorder (``audit.refusals.refusal_append``), one shape
(the refusal's code as ``code``); events written before it still read."""

from __future__ import annotations

import pytest

from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.refusals import REFUSAL_KINDS, refusal_code, refusal_message
from recovery.selectors.operation_page import _event_summary
from tests.support.flow import PARAMS, digest_of

pytestmark = pytest.mark.django_db


def test_a_refused_consumption_says_its_code_as_every_refusal_does(flow):
    flow.approved()
    assert flow.dispatch().status_code == 200
    assert flow.dispatch(worker="again").status_code == 409
    assert flow.dispatch("op-2", digest_of(PARAMS)).status_code in (404, 409)
    refused = AuditEvent.objects.filter(kind__in=REFUSAL_KINDS)
    assert refused.exists()
    assert all("code" in event.data and "reason" not in event.data for event in refused)
    [consumed] = refused.filter(kind=AuditKind.CONSUME_REFUSED, operation_key="op-1")
    assert consumed.data["code"] == "already_consumed"


@pytest.mark.parametrize(
    ("kind", "data", "code"),
    [
        (
            AuditKind.CONSUME_REFUSED,
            {"reason": "already_consumed", "worker": "w"},
            "already_consumed",
        ),
        (
            AuditKind.DECISION_REFUSED,
            {"approval_id": "a", "reason": "digest_mismatch"},
            "digest_mismatch",
        ),
        (AuditKind.OPERATOR_REFUSED, {"action": "void", "code": "forbidden"}, "forbidden"),
        (AuditKind.CONSUME_REFUSED, {"code": "expired", "worker": "w"}, "expired"),
    ],
)
def test_the_code_of_an_event_of_either_shape(kind, data, code) -> None:
    assert refusal_code(kind, data) == code


def test_a_refused_signature_of_either_shape_says_why() -> None:
    old = {"decision": "approve", "code": "signature_invalid", "reason": "malformed"}
    new = {"decision": "approve", "code": "signature_invalid", "message": "malformed"}
    assert refusal_message(AuditKind.SIGNATURE_REFUSED, old) == "malformed"
    assert _event_summary(AuditKind.SIGNATURE_REFUSED, old) == _event_summary(
        AuditKind.SIGNATURE_REFUSED, new
    )


def test_the_timeline_reads_a_consumption_refused_in_either_shape() -> None:
    old = _event_summary(AuditKind.CONSUME_REFUSED, {"reason": "revoked"})
    assert old == _event_summary(AuditKind.CONSUME_REFUSED, {"code": "revoked"})
    assert old == "Permit consumption refused: revoked"
