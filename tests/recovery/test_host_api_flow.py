"""The host API end to end, in-process: register, approve, dispatch once, report, resume."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.test import Client
from guardian.shortcuts import assign_perm

from approvals.models import PermitEvent
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of, sqlite_provider_commit
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation
from recovery.permissions import ProviderPermission
from tests.support.flow import PARAMS, lookups_published

pytestmark = pytest.mark.django_db


def test_registration_is_idempotent_and_a_changed_action_conflicts(flow, host_api):
    first = flow.register()
    assert first["state"] == "awaiting_approval"
    assert first["params_digest"] == digest_of(PARAMS)
    again = host_api.post(
        "/api/v1/operations",
        {"key": "op-1", "action": "payment.send", "provider": "orders", "params": PARAMS},
    )
    assert again.status_code == 200
    assert again.json() == first
    changed = host_api.post(
        "/api/v1/operations",
        {
            "key": "op-1",
            "action": "payment.send",
            "provider": "orders",
            "params": {**PARAMS, "amount": 1251},
        },
    )
    assert changed.status_code == 409
    assert changed.json()["error"] == "key_conflict"
    assert Operation.objects.count() == 1


def test_key_order_and_whitespace_do_not_change_the_digest(flow, host_api):
    flow.register()
    reordered = (
        b'{"key":"op-1","action":"payment.send","provider":"orders",'
        b'"params":{ "to":"acct-7", "currency":"EUR","amount":1250 }}'
    )
    response = host_api.post("/api/v1/operations", raw=reordered)
    assert response.status_code == 200


def test_approved_dispatch_returns_a_token_and_a_second_dispatch_is_already_consumed(flow):
    decided = flow.approved()
    assert decided["status"] == "approved" and decided["permit_id"]
    first = flow.dispatch()
    assert first.status_code == 200, first.content
    assert first.json()["permit_id"] == decided["permit_id"]
    second = flow.dispatch(worker="w2")
    assert second.status_code == 409
    assert second.json()["error"] == "already_consumed"
    assert second.json()["execution_state"] == "dispatched"
    assert Dispatch.objects.count() == 1
    refusals = PermitEvent.objects.filter(kind="refused")
    assert [e.reason for e in refusals] == ["already_consumed"]


def test_dispatch_with_another_digest_is_action_mismatch_and_recorded(flow):
    flow.approved()
    response = flow.dispatch(digest=digest_of({**PARAMS, "amount": 9999}))
    assert response.status_code == 409
    assert response.json()["error"] == "action_mismatch"
    assert PermitEvent.objects.filter(kind="refused", reason="action_mismatch").count() == 1
    assert Operation.objects.get().state == "approved"
    assert flow.dispatch().status_code == 200


def test_dispatch_without_approval_is_not_authorized(flow):
    flow.register()
    response = flow.dispatch()
    assert response.status_code == 409
    assert response.json()["error"] == "not_authorized"
    assert AuditEvent.objects.filter(kind="consume_refused").count() == 1


def test_committed_report_releases_and_a_second_report_is_a_stale_signal(flow, host_api):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    first = host_api.post(
        "/api/v1/operations/op-1/result",
        {"fencing_token": token, "outcome": "committed", "provider_reference": "ord-1"},
    )
    assert first.json() == {"applied": True, "state": "released", "receipt": "succeeded"}
    late = host_api.post(
        "/api/v1/operations/op-1/result", {"fencing_token": token, "outcome": "failed"}
    )
    assert late.json() == {"applied": False, "state": "released", "receipt": "succeeded"}
    assert AuditEvent.objects.filter(kind="stale_signal", data__signal="duplicate_report").exists()


def test_wrong_fencing_token_changes_nothing_and_is_recorded(flow, host_api):
    flow.approved()
    flow.dispatch()
    version = Operation.objects.get().version
    response = host_api.post(
        "/api/v1/operations/op-1/result", {"fencing_token": "forged", "outcome": "committed"}
    )
    assert response.status_code == 409
    assert response.json()["error"] == "stale_fencing_token"
    operation = Operation.objects.get()
    assert (operation.state, operation.version) == ("dispatched", version)
    assert AuditEvent.objects.filter(
        kind="stale_signal", data__signal="stale_fencing_token"
    ).exists()


def test_resume_waits_dispatches_once_then_reports_in_progress(flow):
    flow.register()
    assert flow.resume()["decision"] == "wait"
    flow.approve()
    first = flow.resume(worker="w1")
    assert first["decision"] == "dispatch" and first["fencing_token"]
    second = flow.resume(worker="w2")
    assert 1 <= second.pop("retry_after") <= flow.provider.lease_seconds
    assert second == {"decision": "in_progress", "state": "dispatched", "recovered": False}
    assert Dispatch.objects.count() == 1


def test_resume_queues_one_background_lookup_and_never_looks_up_in_the_request(
    flow, django_capture_on_commit_callbacks
):
    lookups_published()  # what earlier tests of this run left on the queue
    flow.approved()
    flow.dispatch()
    with django_capture_on_commit_callbacks(execute=True):
        live = flow.resume()
    # The worker still holds its lease: come back when it ends, nothing is looked up.
    assert 1 <= live.pop("retry_after") <= flow.provider.lease_seconds
    assert live == {"decision": "in_progress", "state": "dispatched", "recovered": False}
    assert not LookupAttempt.objects.exists() and lookups_published() == []

    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    queued = {"decision": "in_progress", "state": "unknown", "recovered": False, "retry_after": 1}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert flow.resume() == queued
    assert lookups_published() == []  # nothing is sent before the commit
    for callback in callbacks:
        callback()  # the commit
    [attempt] = LookupAttempt.objects.all()
    assert (attempt.status, attempt.trigger) == ("queued", "resume")
    assert lookups_published() == [attempt.pk]  # on the broker, for a worker

    # Asked again while it waits for a worker: the same answer, no second attempt.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert flow.resume(worker="w3") == queued
    assert list(LookupAttempt.objects.values_list("pk", "status")) == [(attempt.pk, "queued")]
    assert callbacks == [] and lookups_published() == []
    assert not Evidence.objects.exists()  # the provider was not read by any request


def test_resume_after_lapsed_lease_releases_once_its_lookup_finds_matching_evidence(
    flow, provider_db
):
    flow.approved()
    flow.dispatch()
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="ord-9")
    answer = flow.resume_looked_up()
    assert answer == {"decision": "released", "state": "released", "recovered": True}
    record = flow.record()
    assert record["receipt"]["recovered"] is True
    assert record["receipt"]["status"] == "succeeded"
    assert record["receipt"]["evidence_id"] == record["evidence"][-1]["evidence_id"]
    assert record["receipt"]["provider_reference"] == "ord-9"


def test_resume_after_lapsed_lease_is_unknown_once_its_lookup_finds_nothing(flow):
    flow.approved()
    flow.dispatch()
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    answer = flow.resume_looked_up()
    assert answer.pop("retry_after") >= 1  # the back-off before the next lookup
    assert answer == {"decision": "unknown", "state": "unknown", "recovered": False}
    assert Evidence.objects.get().verdict == "absent"
    assert Dispatch.objects.count() == 1


def test_heartbeat_extends_a_live_lease(flow, host_api):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    before = Dispatch.objects.get().lease_expires_at
    response = host_api.post("/api/v1/operations/op-1/heartbeat", {"fencing_token": token})
    assert response.status_code == 200
    dispatch = Dispatch.objects.get()
    assert dispatch.lease_expires_at >= before
    assert dispatch.last_heartbeat_at is not None


def test_heartbeat_after_the_lease_lapsed_loses_it_and_the_operation_is_unknown(flow, host_api):
    flow.approved()
    token = flow.dispatch().json()["fencing_token"]
    Dispatch.objects.update(lease_expires_at="2000-01-01T00:00:00Z")
    response = host_api.post("/api/v1/operations/op-1/heartbeat", {"fencing_token": token})
    assert response.status_code == 409
    assert response.json()["error"] == "lease_lost"
    assert Operation.objects.get().state == "unknown"
    assert AuditEvent.objects.filter(data__signal="heartbeat_after_lease").count() == 1


def test_console_user_with_the_decide_permission_on_the_provider_approves(flow, provider):
    user = get_user_model().objects.create_user(username="sup", password="unused-pw")
    assign_perm(ProviderPermission.DECIDE_APPROVALS.perm, user, provider)
    flow.register()
    approval = flow.host_api.post("/api/v1/operations/op-1/approvals").json()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    browser.get("/")  # sets the CSRF cookie, as a console page does
    response = browser.post(
        f"/api/v1/approvals/{approval['approval_id']}/decision",
        data={"decision": "approve", "ttl_seconds": 60, "params_digest": digest_of(PARAMS)},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    assert Operation.objects.get().state == "approved"
    sup = User.objects.get(username="sup")
    assert AuditEvent.objects.filter(kind="transition", actor=Actor.of("user", sup)).exists()


def test_a_digest_that_is_not_one_is_a_422_not_a_recorded_refusal(flow):
    flow.approved()
    response = flow.dispatch(digest="sha256:xyz")
    assert (response.status_code, response.json()["error"]) == (422, "invalid_field")
    assert not PermitEvent.objects.exists()
    assert not AuditEvent.objects.filter(kind="consume_refused").exists()
