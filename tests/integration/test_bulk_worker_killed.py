"""A bulk confirm whose Celery worker is killed mid-batch (SIGKILL, the whole machine):
nothing is lost, the batch resumes, and no item is done twice.

``celery -A settle worker`` runs as in production, against the test database and the
broker the environment names (Redis), on a queue of this test's own. The operations are
inserted in bulk as an outage leaves them (``bench.bulk.matched_seed``): in ``reconcile``,
their provider's evidence a match of a committed record.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db.models import Count

from audit.models import AuditEvent
from bench.bulk import matched_seed
from bulk.models import BulkBatch, BulkItem
from bulk.running import bulk_resume
from bulk.services import Pick, bulk_submit
from common.actors import Actor
from recovery.models import Host, Operation
from recovery.services.providers import provider_configure
from recovery.services.roles import role_grant, roles_ensure
from tests.support.live import assert_audit_intact

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

COUNT = 3000


def _settled(batch: BulkBatch) -> int:
    return BulkItem.objects.filter(batch=batch).exclude(status="pending").count()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def test_a_worker_killed_mid_batch_loses_nothing_and_does_no_item_twice(
    celery_env: Any, celery_procs: Any, celery_queue: str, settings: Any, tmp_path: Path
) -> None:
    # Where this process publishes (the submission, the resume), and a short lease:
    # beat's check takes over a batch two seconds after its last progress.
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_queue
    settings.SETTLE_BULK_CHUNK = 50
    settings.SETTLE_BULK_LEASE_SECONDS = 2
    env = {**celery_env, "SETTLE_BULK_CHUNK": "50", "SETTLE_BULK_LEASE_SECONDS": "2"}
    actor = Actor.system("test")
    host = Host.objects.create(name="fleet", token_hash="sha256:" + "0" * 64)
    provider, _ = provider_configure(
        name="orders", adapter="journal", path=str(tmp_path / "j.jsonl"), actor=actor
    )
    operations = matched_seed(host=host, provider=provider, count=COUNT, prefix="outage")
    roles_ensure()
    user = get_user_model().objects.create_user("olivia")
    role_grant(user=user, role="operator", provider=provider, actor=actor)

    first = celery_procs("worker", env)
    batch = bulk_submit(
        action="confirm",
        picks=[Pick(op.pk, op.version) for op in operations],
        selection="all matching: state=reconcile",
        reason="provider back after the outage",
        actor=Actor.of("user", user),
    )
    _wait(lambda: _settled(batch) >= COUNT // 10, 120, "a tenth of the items settled")
    first.kill()  # SIGKILL to the worker and its pool process, mid-chunk
    at_kill = _settled(batch)
    assert 0 < at_kill < COUNT, at_kill

    # The chunk in flight rolled back with its connection; its message stays unacked
    # until the broker's visibility timeout. A second worker takes the messages still
    # queued, and beat's check publishes again what its lease no longer covers.
    celery_procs("worker", env)
    deadline = time.monotonic() + 180
    while BulkBatch.objects.filter(pk=batch.pk, status="running").exists():
        assert time.monotonic() < deadline, f"{_settled(batch)} of {COUNT} settled"
        bulk_resume()  # what beat runs every SETTLE_BULK_RESUME_SECONDS
        time.sleep(0.5)

    batch.refresh_from_db()
    assert (batch.status, batch.done_count, batch.refused_count) == ("finished", COUNT, 0)
    items = BulkItem.objects.filter(batch=batch)
    assert Counter(items.values_list("status", flat=True)) == {"done": COUNT}
    assert not items.filter(done_at__isnull=True).exists()
    assert Operation.objects.filter(provider=provider, state="released").count() == COUNT
    # Each operation confirmed once, with one operator action, both naming the batch.
    for kind, event in (("transition", "confirm"), ("operator_action", None)):
        events = AuditEvent.objects.filter(kind=kind, data__batch=str(batch.pk))
        if event:
            events = events.filter(data__event=event)
        per_operation = events.values("operation_key").annotate(n=Count("id"))
        assert per_operation.count() == COUNT
        assert {row["n"] for row in per_operation} == {1}
    assert_audit_intact()
