"""Bulk work: a frozen selection, each item done once through its own service, four eyes
for a void batch, every item on its own chain with the batch's id, and a resumed batch.

Operations reach the queue through the host API and the provider's record, as in
production (``tests.support.console.Stuck``); the Celery worker's part is done here
by the task's own body (``bulk_chunk_run``). A real worker killed mid-batch is in
``tests/integration/test_bulk_worker_killed.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.models import AuditEvent
from bulk import running
from bulk.models import BulkBatch, BulkItem
from bulk.running import bulk_chunk_run, bulk_publish, bulk_resume
from bulk.services import Pick, bulk_decide, bulk_submit
from common.actors import Actor
from recovery.models import Dispatch, Operation
from recovery.services.errors import Forbidden, Invalid, RecoveryError
from recovery.services.operator import operation_claim
from tests.support.console import console_user, run_batch

pytestmark = pytest.mark.django_db


def _actor(user) -> Actor:
    return Actor.of("user", user)


def _submit(user, action: str, operations: list[Operation], **kwargs) -> BulkBatch:
    picks = [Pick(op.pk, op.version) for op in operations]
    return bulk_submit(
        action=action,
        picks=kwargs.pop("picks", picks),
        selection="picked by hand",
        reason=kwargs.pop("reason", "provider back after the outage"),
        actor=_actor(user),
        **kwargs,
    )


def _items(batch: BulkBatch) -> dict[int, tuple[str, str]]:
    return {
        item.operation_ref: (item.status, item.code)
        for item in BulkItem.objects.filter(batch=batch)
    }


def test_a_bulk_confirm_releases_what_the_evidence_backs_and_refuses_the_rest(operator, stuck):
    matched = [
        stuck.conflict(f"m-{n}", host_says="failed", provider_says="committed") for n in range(3)
    ]
    mismatched = stuck.mismatch("x-1")
    batch = _submit(operator, "confirm", [*matched, mismatched])
    assert batch.status == "running" and batch.total == 4
    assert all(status == "pending" for status, _ in _items(batch).values())

    run_batch(batch)

    for operation in matched:
        assert Operation.objects.get(pk=operation.pk).state == "released"
    assert Operation.objects.get(pk=mismatched.pk).state == "reconcile"
    items = _items(batch)
    assert [items[op.pk] for op in matched] == [("done", "confirmed")] * 3
    assert items[mismatched.pk] == ("refused", "not_backed")
    assert not ReconciliationRequest.objects.exists()  # a bulk confirm never proposes
    batch.refresh_from_db()
    assert (batch.status, batch.done_count, batch.refused_count) == ("finished", 3, 1)


def test_every_event_an_item_writes_carries_the_batch_id_on_its_own_chain(operator, stuck):
    operation = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    refused = stuck.mismatch("x-1")
    batch = _submit(operator, "confirm", [operation, refused])
    run_batch(batch)

    tagged = AuditEvent.objects.filter(data__batch=str(batch.pk))
    by_chain = {(event.operation_key, event.kind) for event in tagged}
    assert ("m-1", "operator_action") in by_chain
    assert ("m-1", "transition") in by_chain
    assert ("x-1", "operator_refused") in by_chain
    # The submission is on the system chain, with the same id.
    assert ("", "bulk_submitted") in by_chain
    # Nothing written outside the batch carries its id.
    assert not AuditEvent.objects.filter(
        operation_key="m-1", kind="registered", data__batch__isnull=False
    ).exists()


def test_the_selection_is_frozen_with_the_versions_seen_and_a_moved_one_is_refused(
    operator, stuck, provider_db
):
    moved = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    stays = stuck.conflict("m-2", host_says="failed", provider_says="committed")
    seen = moved.version
    # Someone else settles it between the selection and the run.
    other = console_user("otto", "operator", moved.provider)
    batch = _submit(operator, "confirm", [moved, stays])
    from recovery.services.reconcile import operation_reconcile

    operation_reconcile(
        operation=moved, action="confirm", version=seen, reason="by hand", actor=_actor(other)
    )
    run_batch(batch)
    items = _items(batch)
    assert items[moved.pk] == ("refused", "stale_version")
    assert items[stays.pk] == ("done", "confirmed")
    # Later arrivals are not swept in: the batch holds what was submitted.
    stuck.conflict("m-3", host_says="failed", provider_says="committed")
    run_batch(batch)
    assert BulkItem.objects.filter(batch=batch).count() == 2


def test_an_item_runs_once_however_often_its_chunk_is_delivered(operator, stuck):
    operation = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    batch = _submit(operator, "confirm", [operation])
    chunks: list[tuple[str, int, int]] = []
    bulk_publish(batch, send=lambda *args: chunks.append(args))
    [(batch_id, first, last)] = chunks
    assert bulk_chunk_run(batch_id=batch_id, first=first, last=last) == 1
    assert bulk_chunk_run(batch_id=batch_id, first=first, last=last) == 0
    transitions = AuditEvent.objects.filter(
        operation_key="m-1", kind="transition", data__event="confirm"
    )
    assert transitions.count() == 1


def test_another_operators_claim_refuses_that_item_only(operator, stuck):
    claimed = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    free = stuck.conflict("m-2", host_says="failed", provider_says="committed")
    other = console_user("otto", "operator", claimed.provider)
    operation_claim(operation=claimed, actor=_actor(other))
    batch = _submit(operator, "confirm", [claimed, free])
    run_batch(batch)
    items = _items(batch)
    assert items[claimed.pk] == ("refused", "claimed")
    assert items[free.pk] == ("done", "confirmed")


def test_a_forged_id_of_another_provider_and_one_of_nothing_are_refused_per_item(
    operator, stuck, other_stuck
):
    mine = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    theirs = other_stuck.conflict("t-1", host_says="failed", provider_says="committed")
    batch = _submit(
        operator,
        "confirm",
        [],
        picks=[Pick(mine.pk, mine.version), Pick(theirs.pk, theirs.version), Pick(99999, 1)],
    )
    run_batch(batch)
    items = _items(batch)
    assert items[mine.pk] == ("done", "confirmed")
    assert items[theirs.pk] == ("refused", "unknown_operation")
    assert items[99999] == ("refused", "unknown_operation")
    assert Operation.objects.get(pk=theirs.pk).state == "reconcile"
    # Nothing on the chain of an operation the submitter may not see.
    assert not AuditEvent.objects.filter(operation_key="t-1", data__batch=str(batch.pk)).exists()


def test_a_bulk_lookup_queues_one_lookup_per_operation(operator, stuck):
    from recovery.models import LookupAttempt

    operations = [stuck.unknown(f"u-{n}") for n in range(3)]
    batch = _submit(operator, "lookup", operations)
    run_batch(batch)
    assert set(_items(batch).values()) == {("done", "lookup_queued")}
    queued = LookupAttempt.objects.filter(status="queued", trigger="operator")
    assert sorted(queued.values_list("operation_id", flat=True)) == sorted(
        op.pk for op in operations
    )


@pytest.mark.parametrize(
    ("picks", "code"),
    [([], "empty_selection"), ([Pick(n, 1) for n in range(1, 4)], "selection_too_large")],
)
def test_an_empty_or_too_large_selection_is_refused_with_nothing_written(
    operator, settings, picks, code
):
    settings.SETTLE_BULK_MAX_ITEMS = 2
    with pytest.raises(Invalid) as refused:
        _submit(operator, "lookup", [], picks=picks)
    assert refused.value.code == code
    assert not BulkBatch.objects.exists() and not BulkItem.objects.exists()


def test_a_viewer_may_submit_no_batch(viewer, stuck):
    operation = stuck.unknown("u-1")
    with pytest.raises(Forbidden):
        _submit(viewer, "lookup", [operation])
    assert not BulkBatch.objects.exists()


# -- four eyes ---------------------------------------------------------------------------


def test_a_void_batch_waits_and_its_proposer_cannot_approve_it(supervisor, stuck):
    operation = stuck.mismatch("x-1")
    batch = _submit(supervisor, "void", [operation])
    assert batch.status == "proposed"
    with pytest.raises(RecoveryError) as refused:
        bulk_decide(batch_id=batch.pk, approve=True, reason="mine", actor=_actor(supervisor))
    assert refused.value.code == "self_approval"
    recorded = AuditEvent.objects.get(kind="bulk_refused")
    assert recorded.operation_key == "" and recorded.actor == _actor(supervisor)
    assert recorded.data == {"batch": str(batch.pk), "decision": "approve", "code": "self_approval"}
    run_batch(batch)  # nothing runs while it waits
    assert Operation.objects.get(pk=operation.pk).state == "reconcile"
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"


def test_an_operator_without_the_approve_permission_may_not_approve(operator, supervisor, stuck):
    operation = stuck.mismatch("x-1")
    batch = _submit(supervisor, "void", [operation])
    with pytest.raises(Forbidden):
        bulk_decide(batch_id=batch.pk, approve=True, reason="ok", actor=_actor(operator))
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"


def test_an_approved_void_batch_is_each_items_four_eyes_approval(operator, provider, stuck):
    proposer = console_user("sam", "supervisor", provider)
    approver = console_user("sue", "supervisor", provider)
    mismatched = stuck.mismatch("x-1")
    committed = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    batch = _submit(proposer, "void", [mismatched, committed])
    bulk_decide(
        batch_id=batch.pk, approve=True, reason="checked the ledger", actor=_actor(approver)
    )
    run_batch(batch)

    assert Operation.objects.get(pk=mismatched.pk).state == "voided"
    # The provider says this one happened: the void is refused, the batch's approval or not.
    assert Operation.objects.get(pk=committed.pk).state == "reconcile"
    items = _items(batch)
    assert items[mismatched.pk] == ("done", "voided")
    assert items[committed.pk] == ("refused", "evidence_matches")
    request = ReconciliationRequest.objects.get(operation_key="x-1")
    assert request.status == "approved"
    assert request.proposed_by == _actor(proposer)
    assert request.decided_by == _actor(approver)
    approved = AuditEvent.objects.get(operation_key="x-1", kind="reconciliation_approved")
    assert approved.data["batch"] == str(batch.pk)
    assert approved.actor == _actor(approver)


def test_a_rejected_void_batch_does_nothing_and_reports_every_item(supervisor, provider, stuck):
    approver = console_user("sue", "supervisor", provider)
    operation = stuck.mismatch("x-1")
    batch = _submit(supervisor, "void", [operation])
    bulk_decide(batch_id=batch.pk, approve=False, reason="not yet", actor=_actor(approver))
    batch.refresh_from_db()
    assert (batch.status, batch.refused_count) == ("rejected", 1)
    assert _items(batch)[operation.pk] == ("refused", "rejected")
    assert Operation.objects.get(pk=operation.pk).state == "reconcile"
    with pytest.raises(RecoveryError) as again:
        bulk_decide(
            batch_id=batch.pk, approve=True, reason="changed my mind", actor=_actor(approver)
        )
    assert again.value.code == "already_decided"


# -- resume ------------------------------------------------------------------------------


def test_a_batch_whose_lease_lapsed_with_items_pending_is_published_again(operator, stuck):
    operations = [
        stuck.conflict(f"m-{n}", host_says="failed", provider_says="committed") for n in range(2)
    ]
    batch = _submit(operator, "confirm", operations)
    # Its messages were lost (or its worker died): nothing ran. While the lease holds,
    # beat leaves it alone; once it lapses, the pending items are published again.
    sent: list[tuple[str, int, int]] = []
    assert bulk_resume(send=lambda *args: sent.append(args)) == []
    with time_machine.travel(timezone.now() + timedelta(minutes=5)):
        assert bulk_resume(send=lambda *args: sent.append(args)) == [batch.pk]
        assert bulk_resume(send=lambda *args: sent.append(args)) == []  # leased anew
    for batch_id, first, last in sent:
        bulk_chunk_run(batch_id=batch_id, first=first, last=last)
    assert BulkBatch.objects.get(pk=batch.pk).status == "finished"
    assert set(_items(batch).values()) == {("done", "confirmed")}


def test_an_item_of_a_provider_the_submitter_only_views_is_refused_and_recorded(
    operator, stuck, other_provider, other_stuck
):
    from recovery.services.roles import role_grant

    role_grant(user=operator, role="viewer", provider=other_provider, actor=Actor.system("test"))
    mine = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    viewed = other_stuck.conflict("t-1", host_says="failed", provider_says="committed")
    batch = _submit(operator, "confirm", [mine, viewed])
    run_batch(batch)
    items = _items(batch)
    assert items[mine.pk] == ("done", "confirmed")
    assert items[viewed.pk] == ("refused", "forbidden")
    assert Operation.objects.get(pk=viewed.pk).state == "reconcile"
    # They may see it, so the refusal is on its chain, as the operation page's would be.
    [refusal] = AuditEvent.objects.filter(operation_key="t-1", kind="operator_refused")
    assert (refusal.data["code"], refusal.data["batch"]) == ("forbidden", str(batch.pk))
    assert refusal.actor == _actor(operator)


def test_a_bulk_confirm_completes_a_stranded_receipt_and_leaves_no_stranded_mark(operator, stuck):
    # Confirmed one by one or in bulk, a release whose receipt was still running is not
    # left marked as stranded (the queue's stranded branch reads the mark's index).
    operation = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    Dispatch.objects.filter(operation=operation).update(receipt_status="running")
    Operation.objects.filter(pk=operation.pk).update(receipt_running=True)
    operation.refresh_from_db()

    run_batch(_submit(operator, "confirm", [operation]))

    operation.refresh_from_db()
    assert operation.state == "released"
    assert Dispatch.objects.get(operation=operation).receipt_status == "succeeded"
    assert operation.receipt_running is False


def test_a_submission_publishes_one_message_however_many_chunks_its_batch_has(
    operator, stuck, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.SETTLE_BULK_CHUNK = 2
    sent: list[tuple[str, list[object]]] = []
    monkeypatch.setattr(
        running.current_app, "send_task", lambda name, args, **_: sent.append((name, args))
    )
    matched = [
        stuck.conflict(f"one-{n}", host_says="failed", provider_says="committed") for n in range(7)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        batch = _submit(operator, "confirm", matched)
    # The request's one message; its task (a worker) publishes the four chunks.
    assert sent == [("bulk.tasks.bulk_publish", [str(batch.pk)])]
    sent.clear()
    assert running.bulk_publish_run(batch_id=str(batch.pk)) == 4
    assert [name for name, _ in sent] == ["bulk.tasks.bulk_chunk"] * 4
