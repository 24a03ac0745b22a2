"""Operator actions from the console: checked again on the server, audited, refusals too."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from harness.providers import sqlite_provider_commit
from recovery.models import Evidence, LookupAttempt, Operation
from recovery.services.lookup_tasks import lookup_attempt_run
from tests.support.console import client_for

pytestmark = pytest.mark.django_db


def _lookup(
    client: Client, operation: Operation, *, version: int | None = None, reason="customer called"
):
    data = {"version": operation.version if version is None else version, "reason": reason}
    return client.post(f"/operations/{operation.key}/lookup", data)


def _events(operation: Operation, kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(operation_key=operation.key, kind=kind))


def test_look_up_now_queues_a_lookup_that_a_background_worker_settles(operator, stuck, provider_db):
    operation = stuck.unknown("op-1")
    sqlite_provider_commit(
        provider_db, operation_key="op-1", params=operation.params, reference="r-9"
    )
    client = client_for(operator)
    response = _lookup(client, operation)
    assert response.status_code == 302
    # Nothing ran inside the request: the attempt waits for a worker.
    [attempt] = LookupAttempt.objects.filter(operation=operation, trigger="operator")
    assert attempt.status == LookupAttempt.Status.QUEUED
    assert Operation.objects.get(pk=operation.pk).state == "unknown"
    [asked] = _events(operation, "operator_action")
    assert asked.data == {
        "action": "lookup",
        "reason": "customer called",
        "version": operation.version,
    }
    assert (asked.actor.kind, asked.actor.id) == ("user", str(operator.pk))
    # The test's transaction never commits, so no worker was told; the page says so.
    page = client.get(response["Location"]).content.decode()
    assert "could not be reached" in page
    # What the worker's task runs (recovery.tasks.lookup_attempt):
    lookup_attempt_run(attempt_id=attempt.pk)
    assert Operation.objects.get(pk=operation.pk).state == "released"
    assert Evidence.objects.filter(operation=operation, verdict="match").count() == 1


def test_an_operators_lookup_runs_whatever_the_state(operator, stuck, provider_db):
    """The sweeper looks up unknown operations only; an operator may ask in reconcile too."""
    operation = stuck.mismatch("op-1")
    _lookup(client_for(operator), operation)
    attempt = LookupAttempt.objects.get(operation=operation, trigger="operator")
    sqlite_provider_commit(
        provider_db, operation_key="op-1", params=operation.params, reference="r-fixed"
    )
    assert lookup_attempt_run(attempt_id=attempt.pk).looked_up
    assert Operation.objects.get(pk=operation.pk).state == "released"


def test_a_lookup_from_a_stale_page_is_refused_and_changes_nothing(operator, stuck):
    operation = stuck.unknown("op-1")
    seen = operation.version - 1
    shown = client_for(operator).post(
        f"/operations/{operation.key}/lookup", {"version": seen, "reason": "x"}, follow=True
    )
    assert not LookupAttempt.objects.filter(trigger="operator").exists()
    assert Operation.objects.get(pk=operation.pk).version == operation.version
    [refused] = _events(operation, "operator_refused")
    assert refused.data == {
        "action": "lookup",
        "code": "stale_version",
        "version": operation.version,
    }
    text = shown.content.decode()
    assert f"it is now unknown, version {operation.version} (you saw version {seen})" in text


def test_a_lookup_needs_a_reason(operator, stuck):
    operation = stuck.unknown("op-1")
    response = client_for(operator).post(
        f"/operations/{operation.key}/lookup", {"version": operation.version}, follow=True
    )
    assert "give a reason" in response.content.decode()
    assert not LookupAttempt.objects.filter(trigger="operator").exists()
    assert not _events(operation, "operator_action")


def test_a_viewer_may_not_look_up_sees_no_button_and_the_refusal_is_recorded(viewer, stuck):
    operation = stuck.unknown("op-1")
    client = client_for(viewer)
    assert "Look up now" not in client.get(f"/operations/{operation.key}/").content.decode()
    assert _lookup(client, operation).status_code == 403
    assert not LookupAttempt.objects.filter(trigger="operator").exists()
    [refused] = _events(operation, "operator_refused")
    assert (refused.data["code"], refused.actor.id) == ("forbidden", str(viewer.pk))


def test_a_viewer_who_gives_no_reason_is_still_refused_and_recorded(viewer, stuck):
    """A form that fails validation does not hide that the user may not act at all."""
    operation = stuck.unknown("op-1")
    assert _lookup(client_for(viewer), operation, reason="").status_code == 403
    [refused] = _events(operation, "operator_refused")
    assert (refused.data["action"], refused.data["code"]) == ("lookup", "forbidden")


def test_an_operator_sees_the_button(operator, stuck):
    operation = stuck.unknown("op-1")
    page = client_for(operator).get(f"/operations/{operation.key}/").content.decode()
    assert "Look up now" in page and f'value="{operation.version}"' in page


def test_another_providers_operator_gets_404_and_nothing_is_recorded(outsider, stuck):
    operation = stuck.unknown("op-1")
    assert _lookup(client_for(outsider), operation).status_code == 404
    assert not _events(operation, "operator_refused")


def test_anonymous_is_sent_to_sign_in_wrong_method_is_405_csrf_is_required(operator, stuck):
    operation = stuck.unknown("op-1")
    anonymous = _lookup(client_for(None), operation)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client_for(operator).get(f"/operations/{operation.key}/lookup").status_code == 405
    assert _lookup(client_for(operator, csrf_checks=True), operation).status_code == 403
    assert not LookupAttempt.objects.filter(trigger="operator").exists()


def test_a_lookup_while_one_is_in_flight_is_refused(operator, stuck):
    operation = stuck.unknown("op-1")
    now = timezone.now()
    LookupAttempt.objects.create(
        operation=operation,
        trigger="task",
        status=LookupAttempt.Status.QUEUED,
        started_at=now,
        lease_expires_at=now + timedelta(minutes=1),
    )
    _lookup(client_for(operator), operation)
    assert not LookupAttempt.objects.filter(trigger="operator").exists()
    [refused] = _events(operation, "operator_refused")
    assert refused.data["code"] == "lookup_in_flight"


def test_a_lookup_whose_worker_died_does_not_block_the_operator(operator, stuck):
    """The rule every lookup follows: an attempt past its lease is abandoned, not waited on."""
    operation = stuck.unknown("op-1")
    now = timezone.now()
    dead = LookupAttempt.objects.create(
        operation=operation,
        trigger="task",
        status=LookupAttempt.Status.RUNNING,
        started_at=now - timedelta(minutes=5),
        lease_expires_at=now - timedelta(minutes=1),
    )
    _lookup(client_for(operator), Operation.objects.get(pk=operation.pk))
    dead.refresh_from_db()
    assert dead.status != LookupAttempt.Status.RUNNING
    assert LookupAttempt.objects.filter(operation=operation, trigger="operator").count() == 1
    assert not _events(operation, "operator_refused")
