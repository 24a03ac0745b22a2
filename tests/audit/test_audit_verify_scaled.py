"""Verification that keeps up with the log: routine (what is new), a full job in slices,
a checkpoint's backlog read a batch at a time, and the status line when it is late."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit import checkpoints, tasks
from audit.chain import audit_append, audit_transaction
from audit.checkpoints import audit_checkpoint
from audit.models import AuditCheckpoint, AuditEvent, AuditVerification, AuditVerifyJob
from audit.verification import audit_verification_incremental, audit_verify_job_step

pytestmark = pytest.mark.django_db(transaction=True)


def _events(count: int, *, start: int = 0) -> None:
    """``count`` events on the system chain."""
    for number in range(count):
        with audit_transaction():
            audit_append(kind="test", data={"n": start + number})


def _checkpoint_in_the_past(minutes: int = 10) -> None:
    with time_machine.travel(timezone.now() - timedelta(minutes=minutes), tick=True):
        assert audit_checkpoint() is not None


def _rewrite_event(event_id: int) -> None:
    """Edit one event as someone with SQL access would (triggers off), keeping its hash."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE audit_auditevent SET data = %s WHERE id = %s",
            [json.dumps({"n": "forged"}), event_id],
        )
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER USER")


def test_routine_verification_checks_only_what_was_signed_since_the_last_verified_one():
    _events(20)
    _checkpoint_in_the_past()
    call_command("verify_audit", "--no-checkpoint")  # the full one, through checkpoint #1
    _events(5, start=20)
    assert audit_checkpoint() is not None
    verification = audit_verification_incremental()
    assert verification is not None and verification.ok, verification.problem
    assert verification.scope == AuditVerification.Scope.INCREMENTAL
    assert verification.checkpoint == 2
    assert verification.events_checked == 5
    # Nothing newly signed: verified again, through the same checkpoint, reading nothing.
    again = audit_verification_incremental()
    assert again is not None and again.ok and again.checkpoint == 2
    assert again.events_checked == 0


def test_routine_verification_finds_a_newly_signed_event_rewritten():
    _events(10)
    _checkpoint_in_the_past()
    call_command("verify_audit", "--no-checkpoint")
    _events(3, start=10)
    assert audit_checkpoint() is not None
    newest = AuditEvent.objects.order_by("-id").first()
    assert newest is not None
    _rewrite_event(newest.pk)
    verification = audit_verification_incremental()
    assert verification is not None and not verification.ok
    assert verification.problem == (
        "the system chain, event #13: content does not match its hash (edited)"
    )
    # The next routine run starts from the last intact one again: still broken.
    assert not audit_verification_incremental().ok  # type: ignore[union-attr]


def test_routine_verification_of_a_backlog_goes_on_over_several_runs():
    _events(4)
    _checkpoint_in_the_past(30)
    call_command("verify_audit", "--no-checkpoint")
    for round_ in range(3):
        _events(4, start=10 * round_)
        with time_machine.travel(timezone.now() - timedelta(minutes=20 - 5 * round_), tick=True):
            assert audit_checkpoint() is not None
    first = audit_verification_incremental(max_events=4)
    assert first is not None and first.ok and first.checkpoint == 2
    second = audit_verification_incremental(max_events=4)
    assert second is not None and second.ok and second.checkpoint == 3


def test_the_routine_task_is_the_incremental_verification():
    _events(3)
    _checkpoint_in_the_past()
    call_command("verify_audit", "--no-checkpoint")
    _events(2, start=3)
    assert audit_checkpoint() is not None
    assert tasks.audit_verify() is True
    newest = AuditVerification.objects.order_by("-id").first()
    assert newest is not None and newest.scope == AuditVerification.Scope.INCREMENTAL


def _job_to_its_end(slice_events: int) -> AuditVerifyJob:
    for _ in range(100):
        job = audit_verify_job_step(slice_events=slice_events, chunk_size=2)
        assert job is not None
        if job.phase == AuditVerifyJob.Phase.DONE:
            return job
    raise AssertionError("the job did not finish in 100 slices")


def test_the_full_verification_job_goes_on_slice_by_slice_and_records_its_outcome(
    operations_many,
):
    assert audit_checkpoint() is not None
    job = _job_to_its_end(slice_events=2)
    assert job.slices >= 5  # checkpoints, at least three slices of chains, the last checks
    assert job.verification is not None and job.verification.ok, job.verification.problem
    assert job.verification.scope == AuditVerification.Scope.FULL
    assert job.events_checked == AuditEvent.objects.count()
    # Finished: no new job until its interval has passed.
    assert audit_verify_job_step(slice_events=2, restart_after_seconds=3600) is None


def test_the_full_verification_job_finds_a_rewrite_in_a_later_slice(operations_many):
    assert audit_checkpoint() is not None
    last_chain = AuditEvent.objects.order_by("-operation_key", "-seq").first()
    assert last_chain is not None
    _rewrite_event(last_chain.pk)
    job = _job_to_its_end(slice_events=2)
    assert job.verification is not None and not job.verification.ok
    assert last_chain.operation_key in job.verification.problem


def test_a_checkpoint_after_a_backlog_holds_one_batch_of_chains_at_a_time(
    operations_many, monkeypatch
):
    monkeypatch.setattr(checkpoints, "_BATCH", 2)
    seen: list[int] = []
    real = checkpoints._events_since

    def counted(spans):
        seen.append(len(spans))
        return real(spans)

    monkeypatch.setattr(checkpoints, "_events_since", counted)
    assert audit_checkpoint() is not None
    assert len(seen) >= 3 and max(seen) <= 2
    call_command("verify_audit", "--no-checkpoint")


@pytest.fixture
def operations_many(host, provider) -> list[str]:
    """Six registered operations (six chains), and the system chain."""
    from recovery.services.registration import operation_register
    from tests.support.flow import PARAMS

    keys = [f"op-{n}" for n in range(6)]
    for key in keys:
        operation_register(
            host=host, key=key, action="payment.send", provider_name="orders", params=PARAMS
        )
    return keys


def test_status_turns_red_when_verification_is_late(admin_user, settings):
    _events(2)
    _checkpoint_in_the_past(minutes=200)
    settings.SETTLE_AUDIT_VERIFY_LATE_SECONDS = 600
    late = timezone.now() - timedelta(seconds=900)
    AuditVerification.objects.create(
        at=late, finished_at=late, ok=True, scope=AuditVerification.Scope.INCREMENTAL
    )
    client = Client()
    client.force_login(admin_user)
    body = client.get("/healthz?detail=1").json()
    check = body["checks"]["audit verification"]
    assert check["ok"] is False
    assert "red after 600 s" in check["detail"]
    tasks.audit_verify()  # on time again
    body = client.get("/healthz?detail=1").json()
    assert body["checks"]["audit verification"]["ok"] is True, body


def test_a_backlog_of_more_chains_than_one_checkpoint_holds_is_signed_by_several(
    operations_many, monkeypatch, settings
):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_CHAINS", 3)
    last = audit_checkpoint()
    assert last is not None and last.number == 3  # seven chains: 3 + 3 + 1
    signed = AuditCheckpoint.objects.order_by("number")
    assert [len(checkpoint.heads) for checkpoint in signed] == [3, 3, 1]
    assert len({checkpoint.watermark for checkpoint in signed}) == 1
    lines = settings.SETTLE_AUDIT_CHECKPOINT_FILE.read_text("utf-8").splitlines()
    assert len(lines) == 3
    call_command("verify_audit", "--no-checkpoint")
