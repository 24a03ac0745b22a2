"""The sweep and its background lookups, called in-process (the Celery side is in
``tests/integration/test_background_recovery.py``).

``publish`` is the only seam: here a list collects the attempt ids a sweep would send.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from audit.models import AuditEvent
from harness.providers import sqlite_provider_commit
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation, Provider
from recovery.services.evidence import LOOKUP_BACKOFF_JITTER, LOOKUP_BACKOFF_SECONDS
from recovery.services.lookup_tasks import _attempt_begin, lookup_attempt_run
from recovery.services.lookups import SWEEPER_ACTOR, lookup_run
from recovery.services.sweep import sweep
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db


def _crashed(flow, key: str = "op-1") -> None:
    """Approved and dispatched; the worker died and its lease lapsed."""
    flow.approved(key)
    assert flow.dispatch(key).status_code == 200
    Dispatch.objects.filter(operation__key=key).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def _sweep() -> list[int]:
    published: list[int] = []
    sweep(publish=published.append)
    return published


def _transitions(key: str, event: str) -> int:
    return AuditEvent.objects.filter(
        operation_key=key, kind="transition", data__event=event
    ).count()


def test_a_lapsed_lease_goes_to_unknown_and_its_lookup_is_queued_and_published(flow):
    _crashed(flow)
    published = _sweep()

    op = Operation.objects.get()
    assert op.state == "unknown"
    [transition] = AuditEvent.objects.filter(kind="transition", data__event="lease_lost")
    assert transition.actor == SWEEPER_ACTOR
    assert transition.data["reason"] == "no heartbeat or report before the lease expired"
    [attempt] = LookupAttempt.objects.all()
    assert (attempt.status, attempt.trigger) == ("queued", "task")
    assert published == [attempt.pk]


def test_a_live_lease_is_left_alone(flow):
    flow.approved()
    assert flow.dispatch().status_code == 200
    assert _sweep() == []
    assert Operation.objects.get().state == "dispatched"


def test_a_queued_lookup_releases_on_matching_evidence_once_however_often_it_runs(
    flow, provider_db
):
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    [attempt_id] = _sweep()

    first = lookup_attempt_run(attempt_id=attempt_id)
    again = lookup_attempt_run(attempt_id=attempt_id)

    assert (first.looked_up, first.state) == (True, "released")
    assert (again.looked_up, again.state) == (False, "released")
    assert _transitions("op-1", "evidence_match") == 1
    assert Evidence.objects.count() == 1
    assert Dispatch.objects.get().receipt_recovered is True
    assert LookupAttempt.objects.get().status == "finished"


def test_resume_answers_in_progress_while_a_lookup_is_queued_and_starts_no_second(flow):
    _crashed(flow)
    assert len(_sweep()) == 1
    answer = flow.resume()
    assert answer["decision"] == "in_progress" and answer["state"] == "unknown"
    assert answer["retry_after"] >= 1
    assert LookupAttempt.objects.count() == 1
    assert _sweep() == []  # nor does another sweep


def test_a_running_attempt_with_a_live_lease_is_not_run_twice(flow):
    _crashed(flow)
    [attempt_id] = _sweep()
    LookupAttempt.objects.filter(pk=attempt_id).update(
        status="running", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    outcome = lookup_attempt_run(attempt_id=attempt_id)
    assert not outcome.looked_up and 1 <= outcome.retry_in <= 31
    assert Evidence.objects.count() == 0


def test_a_running_attempt_whose_worker_died_is_taken_over_by_its_redelivered_message(
    flow, provider_db
):
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    [attempt_id] = _sweep()
    LookupAttempt.objects.filter(pk=attempt_id).update(
        status="running", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    outcome = lookup_attempt_run(attempt_id=attempt_id)
    assert (outcome.looked_up, outcome.state) == (True, "released")
    assert LookupAttempt.objects.get().status == "finished"


def test_a_queued_attempt_nobody_started_is_queued_again_after_its_lease(flow, settings):
    _crashed(flow)
    [first] = _sweep()
    assert _sweep() == []
    later = timezone.now() + timedelta(seconds=settings.SETTLE_LOOKUP_QUEUE_SECONDS + 1)
    with time_machine.travel(later):
        [second] = _sweep()
    assert second != first
    statuses = dict(LookupAttempt.objects.values_list("pk", "status"))
    assert statuses == {first: "abandoned", second: "queued"}
    # The first message, delivered at last, changes nothing.
    assert lookup_attempt_run(attempt_id=first).looked_up is False
    assert AuditEvent.objects.filter(kind="lookup_abandoned").count() == 1


def test_a_failed_publish_strands_nothing(flow, settings):
    _crashed(flow)

    def broker_down(attempt_id: int) -> None:
        raise ConnectionError("broker down")

    report = sweep(publish=broker_down)
    assert report.publish_failed and report.published == 0
    [attempt] = LookupAttempt.objects.all()
    assert attempt.status == "queued"  # committed before the publish: durable
    later = timezone.now() + timedelta(seconds=settings.SETTLE_LOOKUP_QUEUE_SECONDS + 1)
    with time_machine.travel(later):
        assert len(_sweep()) == 1


def test_with_the_broker_down_leases_still_lapse_and_their_lookups_are_queued_later(flow):
    for key in ("op-1", "op-2", "op-3"):
        _crashed(flow, key)

    def broker_down(attempt_id: int) -> None:
        raise ConnectionError("broker down")

    # One lease per batch: the first batch's publish fails, the next two only lapse.
    report = sweep(publish=broker_down, batch_size=1)
    assert len(report.leases_lapsed) == 3 and report.publish_failed
    assert set(Operation.objects.values_list("state", flat=True)) == {"unknown"}
    [first] = LookupAttempt.objects.all()  # queued with the first batch, not published
    assert report.lookups_queued == [first.pk]

    # The broker is back: the other two are due and queued; the first's lease is alive.
    published = _sweep()
    assert len(published) == 2
    queued = LookupAttempt.objects.filter(pk__in=published)
    assert {attempt.operation.key for attempt in queued} == {"op-1", "op-2", "op-3"} - {
        first.operation.key
    }


def test_an_operation_settled_while_its_lookup_was_queued_is_not_looked_up(flow):
    _crashed(flow)
    [attempt_id] = _sweep()
    Operation.objects.filter(key="op-1").update(state="reconcile")  # e.g. a callback
    outcome = lookup_attempt_run(attempt_id=attempt_id)
    assert (outcome.looked_up, outcome.state) == (False, "reconcile")
    assert LookupAttempt.objects.get().status == "abandoned"
    assert Evidence.objects.count() == 0


def test_absent_evidence_backs_off_with_jitter_then_reconciles_after_the_budget(
    flow, provider: Provider
):
    _crashed(flow)
    budget = provider.lookup_budget
    now = timezone.now()
    for count in range(1, budget + 1):
        with time_machine.travel(now):
            [attempt_id] = _sweep()
            outcome = lookup_attempt_run(attempt_id=attempt_id)
        op = Operation.objects.get()
        if count < budget:
            assert outcome.state == "unknown" and op.lookups_inconclusive == count
            delay = (op.next_lookup_at - now).total_seconds()
            base = LOOKUP_BACKOFF_SECONDS[count - 1]
            assert base * (1 - LOOKUP_BACKOFF_JITTER) - 1 <= delay
            assert delay <= base * (1 + LOOKUP_BACKOFF_JITTER) + 1
            with time_machine.travel(now):
                assert _sweep() == []  # not due yet
            now = op.next_lookup_at + timedelta(seconds=1)
    assert outcome.state == "reconcile"
    [escalation] = AuditEvent.objects.filter(kind="transition", data__event="escalate")
    assert escalation.data["detail"] == f"evidence unavailable after {budget} lookups"
    assert escalation.actor == SWEEPER_ACTOR
    assert Dispatch.objects.count() == 1


def test_a_lookup_that_outlived_its_lease_and_was_taken_over_applies_nothing(flow, provider_db):
    """Its worker stalled past the lease; the redelivered message ran the attempt again."""
    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    [attempt_id] = _sweep()
    stalled, _ = _attempt_begin(attempt_id, SWEEPER_ACTOR)
    assert stalled is not None
    LookupAttempt.objects.filter(pk=attempt_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    taken_over = lookup_attempt_run(attempt_id=attempt_id)
    assert (taken_over.looked_up, taken_over.state) == (True, "released")

    late = lookup_run(attempt=stalled, actor=SWEEPER_ACTOR)

    assert late.state == "released"
    assert Evidence.objects.count() == 1
    assert _transitions("op-1", "evidence_match") == 1
    signal = AuditEvent.objects.get(kind="stale_signal", data__signal="lookup_superseded")
    assert signal.data["lookup_id"] == attempt_id and signal.data["verdict"] == "match"


def test_the_tasks_are_thin_calls_of_their_services(flow, provider_db, monkeypatch):
    """Called directly (in-process, as a worker's pool process runs them).

    Publishing to a real broker is the integration tests' part; here the sweep task's
    publish is collected instead.
    """
    from audit import tasks as audit_tasks
    from audit.models import AuditCheckpoint
    from recovery import tasks

    _crashed(flow)
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r1")
    published: list[list[int]] = []
    monkeypatch.setattr(tasks.lookup_batch, "delay", published.append)
    counts = tasks.sweep()
    assert counts == {
        "leases_lapsed": 1,
        "lookups_queued": 1,
        "published": 1,
        "approvals_expired": 0,
    }
    [[attempt_id]] = published
    assert tasks.lookup_batch([attempt_id]) == 1
    assert tasks.lookup_batch([attempt_id]) == 0  # again: nothing changes
    assert tasks.lookup_attempt(attempt_id) == "released"  # nor does the single task
    assert _transitions("op-1", "evidence_match") == 1

    number = audit_tasks.audit_checkpoint()
    assert number == AuditCheckpoint.objects.get().number
    assert audit_tasks.audit_checkpoint() is None  # nothing moved since
