"""Only matching evidence releases; newer verified facts win; late signals are recorded."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Permit, PermitEvent
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import (
    digest_of,
    sqlite_provider_commit,
    sqlite_provider_init,
    sqlite_provider_tamper,
)
from recovery.models import Dispatch, LookupAttempt, Operation, Provider
from recovery.services.lookups import operation_lookup
from tests.support.flow import PARAMS, lookup_due

pytestmark = pytest.mark.django_db


def _crashed(flow, key: str = "op-1") -> str:
    """Approve, dispatch, and let the worker's lease lapse; returns the fencing token."""
    flow.approved(key)
    token = flow.dispatch(key).json()["fencing_token"]
    Dispatch.objects.filter(operation__key=key).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    return token


def _stale_signals(name: str) -> int:
    return AuditEvent.objects.filter(kind="stale_signal", data__signal=name).count()


def _callback(host_api, provider: Provider, body: dict, *, secret: str | None = None):
    raw = json.dumps(body).encode()
    signature = hmac.new((secret or provider.secret).encode(), raw, hashlib.sha256).hexdigest()
    return host_api.client.post(
        f"/api/v1/providers/{provider.name}/callbacks",
        data=raw,
        content_type="application/json",
        HTTP_X_PROVIDER_SIGNATURE=signature,
    )


@pytest.fixture
def signed_provider(provider) -> Provider:
    Provider.objects.filter(pk=provider.pk).update(secret="cb-secret")
    provider.refresh_from_db()
    return provider


def test_mismatching_evidence_goes_to_reconcile_and_restored_evidence_releases(flow, provider_db):
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    sqlite_provider_tamper(provider_db, "op-1", "other_params")
    assert flow.resume_looked_up()["decision"] == "reconcile"
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    lookup_due("op-1")
    released = flow.resume_looked_up()
    assert released == {"decision": "released", "state": "released", "recovered": True}
    # The recheck of a reconcile was resume's own lookup (the sweeper's are for unknown
    # operations only), run by the background worker.
    recheck = LookupAttempt.objects.order_by("pk").last()
    assert (recheck.trigger, recheck.status, recheck.evidence.verdict) == (
        "resume",
        "finished",
        "match",
    )
    assert Dispatch.objects.count() == 1
    assert Permit.objects.get().consumed_at is not None


@pytest.mark.parametrize("mode", ["delete_receipt", "bad_json", "wrong_stored_digest"])
def test_corrupt_evidence_never_releases(flow, provider_db, mode):
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    sqlite_provider_tamper(provider_db, "op-1", mode)
    answer = flow.resume_looked_up()
    assert answer["decision"] == "reconcile"
    assert Operation.objects.get().recovered is False
    assert Dispatch.objects.get().receipt_status == "running"


def test_absent_evidence_stays_unknown_with_backoff_until_the_budget_is_spent(flow, provider):
    _crashed(flow)
    budget = provider.lookup_budget
    for attempt in range(1, budget):
        answer = flow.resume_looked_up()
        assert answer["decision"] == "unknown"
        operation = Operation.objects.get()
        assert operation.lookups_inconclusive == attempt
        assert operation.next_lookup_at > timezone.now()
        assert answer["retry_after"] >= 1  # until the back-off runs out
        # Before then, resume answers as it stands and queues nothing.
        again = flow.resume()
        assert (again["decision"], again["state"]) == ("unknown", "unknown")
        assert 1 <= again["retry_after"] <= answer["retry_after"]
        assert not LookupAttempt.objects.filter(status="queued").exists()
        lookup_due("op-1")
    assert flow.resume_looked_up()["decision"] == "reconcile"
    # In reconcile, resume looks again only after a long pause (evidence may be repaired).
    assert Operation.objects.get().next_lookup_at > timezone.now() + timedelta(minutes=4)
    assert flow.resume()["retry_after"] > 4 * 60
    assert LookupAttempt.objects.count() == budget
    assert Dispatch.objects.count() == 1


def test_unavailable_provider_is_never_success(flow, provider):
    _crashed(flow)
    Provider.objects.filter(pk=provider.pk).update(path="/nonexistent/orders.sqlite3")
    answer = flow.resume_looked_up()
    retry_after = answer.pop("retry_after")
    assert answer == {"decision": "unknown", "state": "unknown", "recovered": False}
    assert retry_after >= 1  # the back-off before the next lookup
    assert flow.record()["evidence"][-1]["verdict"] == "unavailable"


def test_provider_record_of_failure_fails_the_operation_with_a_recovery_receipt(flow, provider_db):
    _crashed(flow)
    sqlite_provider_commit(
        provider_db, operation_key="op-1", params=PARAMS, reference="r1", status="failed"
    )
    answer = flow.resume_looked_up()
    assert answer == {"decision": "closed", "state": "failed", "recovered": True}
    receipt = Dispatch.objects.get()
    assert (receipt.receipt_status, receipt.receipt_recovered) == ("failed", True)


def test_stale_negative_lookup_after_release_changes_nothing(flow, provider_db):
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    assert flow.resume_looked_up()["decision"] == "released"
    released = Operation.objects.get()
    sqlite_provider_tamper(provider_db, "op-1", "delete_order")
    sqlite_provider_tamper(provider_db, "op-1", "delete_receipt")
    operation_lookup(operation=released, trigger="operator", actor=Actor.system("test"))
    after = Operation.objects.get()
    assert (after.state, after.version) == ("released", released.version)
    assert _stale_signals("evidence_after_settlement") == 1


def test_report_after_lease_lapsed_is_recorded_but_only_evidence_releases(
    flow, host_api, provider_db
):
    token = _crashed(flow)
    assert flow.resume_looked_up()["decision"] == "unknown"  # nothing at the provider yet
    late = host_api.post(
        "/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "committed"}
    )
    assert late.json() == {"applied": True, "state": "unknown", "receipt": "succeeded"}
    assert _stale_signals("report_after_lease") == 1
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    lookup_due("op-1")
    assert flow.resume_looked_up()["decision"] == "released"


def test_verified_completion_after_a_failed_report_is_a_conflict(flow, host_api, signed_provider):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    host_api.post("/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "failed"})
    assert Operation.objects.get().state == "failed"
    response = _callback(
        host_api,
        signed_provider,
        {
            "operation_key": "op-1",
            "status": "committed",
            "params_digest": digest_of(PARAMS),
            "reference": "r1",
            "sequence": 1,
        },
    )
    assert response.json() == {"applied": True, "state": "reconcile"}


def test_signed_callback_releases_a_dispatched_operation(flow, host_api, signed_provider):
    flow.approved()
    flow.dispatch()
    response = _callback(
        host_api,
        signed_provider,
        {
            "operation_key": "op-1",
            "status": "committed",
            "params_digest": digest_of(PARAMS),
            "reference": "r1",
            "sequence": 3,
        },
    )
    assert response.json() == {"applied": True, "state": "released"}
    receipt = Dispatch.objects.get()
    assert (receipt.receipt_status, receipt.receipt_recovered) == ("succeeded", True)


def test_callback_with_other_digest_is_a_mismatch_for_an_operator(flow, host_api, signed_provider):
    _crashed(flow)
    response = _callback(
        host_api,
        signed_provider,
        {
            "operation_key": "op-1",
            "status": "committed",
            "params_digest": digest_of({"amount": 1}),
            "reference": "r1",
            "sequence": 1,
        },
    )
    assert response.json() == {"applied": True, "state": "reconcile"}


def test_lower_callback_sequence_is_stale_and_never_applied(flow, host_api, signed_provider):
    _crashed(flow)
    body = {
        "operation_key": "op-1",
        "status": "failed",
        "params_digest": digest_of(PARAMS),
        "reference": "r1",
        "sequence": 5,
    }
    _callback(host_api, signed_provider, {**body, "params_digest": digest_of({"x": 1})})
    version = Operation.objects.get().version
    stale = _callback(host_api, signed_provider, {**body, "sequence": 4})
    assert stale.json() == {"applied": False, "state": "reconcile", "reason": "stale_sequence"}
    assert Operation.objects.get().version == version
    assert _stale_signals("stale_callback_sequence") == 1


def test_error_callback_after_release_is_a_stale_signal(flow, host_api, signed_provider):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    host_api.post(
        "/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "committed"}
    )
    released = Operation.objects.get()
    response = _callback(
        host_api,
        signed_provider,
        {
            "operation_key": "op-1",
            "status": "failed",
            "params_digest": digest_of(PARAMS),
            "reference": "r1",
            "sequence": 9,
        },
    )
    assert response.json() == {"applied": False, "state": "released", "reason": "settled"}
    after = Operation.objects.get()
    assert (after.state, after.version) == ("released", released.version)
    assert _stale_signals("callback_after_settlement") == 1


def test_revoked_permit_closes_the_approved_operation_and_refuses_dispatch(flow, host_api):
    decided = flow.approved()
    revoke = host_api.post(
        f"/api/v1/permits/{decided['permit_id']}/revoke", {"reason": "customer changed mind"}
    )
    assert revoke.json() == {
        "permit_id": decided["permit_id"],
        "status": "revoked",
        "revoked": True,
    }
    assert Operation.objects.get().state == "revoked"
    refused = flow.dispatch()
    assert refused.json()["error"] == "revoked"
    assert flow.resume()["decision"] == "closed"
    assert not Dispatch.objects.exists()


def test_revocation_after_dispatch_guards_nothing_and_is_recorded(flow, host_api):
    decided = flow.approved()
    flow.dispatch()
    revoke = host_api.post(f"/api/v1/permits/{decided['permit_id']}/revoke", {"reason": "late"})
    assert revoke.json()["revoked"] is False
    assert Permit.objects.get().status == "consumed"
    assert PermitEvent.objects.filter(kind="revoke_ignored").count() == 1
    assert Operation.objects.get().state == "dispatched"


def test_expired_permit_is_refused_and_recorded(flow):
    flow.approved()
    now = timezone.now()
    Permit.objects.update(
        issued_at=now - timedelta(seconds=10), expires_at=now - timedelta(seconds=1)
    )
    response = flow.dispatch()
    assert response.status_code == 409
    assert response.json()["error"] == "expired"
    assert Permit.objects.get().status == "expired"
    assert Operation.objects.get().state == "expired"
    history = [(line["kind"], line["reason"]) for line in flow.record()["permit"]["history"]]
    assert history == [("issued", ""), ("expired", ""), ("refused", "expired")]
    assert not Dispatch.objects.exists()


def test_an_out_of_range_integer_in_the_record_is_corrupt_and_the_lookup_completes(
    flow, provider, tmp_path
):
    """2^53 in the provider's record: reconcile, never a 500 and never a lookup left open."""
    path = tmp_path / "integer-orders.sqlite3"
    sqlite_provider_init(path, created_at="INTEGER")
    Provider.objects.filter(pk=provider.pk).update(path=str(path))
    _crashed(flow)
    sqlite_provider_commit(path, operation_key="op-1", params=PARAMS, reference="r1")
    sqlite_provider_tamper(path, "op-1", "huge_created_at")
    answer = flow.resume_looked_up()
    assert answer.pop("retry_after") >= 1  # until reconcile's next look
    assert answer == {"decision": "reconcile", "state": "reconcile", "recovered": False}
    evidence = flow.record()["evidence"][-1]
    assert evidence["verdict"] == "corrupt"
    assert "9007199254740992" in evidence["detail"]
    assert LookupAttempt.objects.get().status == "finished"
