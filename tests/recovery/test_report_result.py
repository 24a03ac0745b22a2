"""A host's report may carry what the effect returned: the receipt keeps the first one."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from common.canonical import MAX_RESULT_BYTES, canonical_params, params_digest
from recovery.models import Dispatch, Operation

pytestmark = pytest.mark.django_db

RESULT = {"payment_id": "pay-1", "amount": 1250}


def _report(host_api, token, **fields):
    return host_api.post(
        "/api/v1/operations/op-1/result",
        {"fencing_token": token, "outcome": "committed", **fields},
    )


def test_the_first_reports_result_is_kept_and_read_back_with_the_receipt(flow, host_api):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    assert _report(host_api, token, result=RESULT).json()["state"] == "released"
    _report(host_api, token, result={"payment_id": "pay-2"})
    record = host_api.get("/api/v1/operations/op-1").json()
    assert record["receipt"]["result"] == RESULT
    line = AuditEvent.objects.get(kind="host_report")
    assert line.data["result_digest"] == params_digest(canonical_params(RESULT))
    assert "payment_id" not in str(line.data)


def test_a_report_without_a_result_reads_back_null(flow, host_api):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    _report(host_api, token)
    assert host_api.get("/api/v1/operations/op-1").json()["receipt"]["result"] is None


@pytest.mark.parametrize(
    ("result", "reason"),
    [
        ({"blob": "x" * MAX_RESULT_BYTES}, "result_too_large"),
        ([1, 2], None),
        ("text", None),
    ],
)
def test_a_result_too_large_or_not_an_object_is_refused_and_nothing_is_reported(
    flow, host_api, result, reason
):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    response = _report(host_api, token, result=result)
    assert response.status_code == 422, response.content
    assert response.json()["error"] == "invalid_field"
    assert response.json().get("reason") == reason
    assert Operation.objects.get().state == "dispatched"
    assert Dispatch.objects.get().receipt_status == "running"
