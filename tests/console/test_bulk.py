"""Bulk work in the console: the queue's selection, the preview's exact count, submitting,
the batch's page, its report and CSV, and approving a void batch — for an operator, a
viewer, another provider's operator, anonymous, without CSRF, and from a stale page.

The worker's part is done in this process by the task's own body
(``tests.support.console.run_batch``).
"""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from bulk.models import BulkBatch, BulkItem
from recovery.models import Operation, Provider
from tests.support.console import client_for, console_user, run_batch

pytestmark = pytest.mark.django_db


def _pick(operation: Operation, version: int | None = None) -> str:
    return f"{operation.pk}.{operation.version if version is None else version}"


def _submit(client: Client, action: str, ops: list[str] | None = None, **fields: str):
    data: dict[str, object] = {"action": action, "why": "provider back", **fields}
    if ops is not None:
        data["op"] = ops
    return client.post("/bulk/", data)


def _batch() -> BulkBatch:
    return BulkBatch.objects.get()


def _matched(stuck, n: int = 2) -> list[Operation]:
    return [
        stuck.conflict(f"m-{i}", host_says="failed", provider_says="committed") for i in range(n)
    ]


# -- the queue and the preview ----------------------------------------------------------


def test_the_queue_offers_a_checkbox_per_row_and_all_that_match(operator, stuck):
    operation = stuck.unknown("u-1")
    page = client_for(operator).get("/?state=unknown").content.decode()
    assert f'name="op" value="{operation.pk}.{operation.version}"' in page
    assert 'href="/bulk/preview?state=unknown"' in page


def test_a_viewer_is_offered_no_selection_nor_bulk_actions(viewer, stuck):
    stuck.unknown("u-1")
    page = client_for(viewer).get("/?state=unknown").content.decode()
    assert "u-1" in page
    assert 'name="op"' not in page
    assert "data-pick-all" not in page
    assert "Act on selected" not in page and "/bulk/preview" not in page


def test_the_preview_counts_exactly_what_the_filter_matches(operator, stuck, other_stuck):
    stuck.unknown("u-1")
    stuck.unknown("u-2")
    stuck.mismatch("x-1")
    other_stuck.unknown("t-1")  # another provider's: not the operator's to see
    client = client_for(operator)
    every = client.get("/bulk/preview")
    assert every.status_code == 200
    assert every.context["count"] == 3
    unknown = client.get("/bulk/preview?state=unknown")
    assert unknown.context["count"] == 2
    page = unknown.content.decode()
    assert "Look up now" in page and "Confirm" in page and "Propose void" in page


def test_the_preview_counts_hand_picked_operations(operator, stuck):
    first, second = stuck.unknown("u-1"), stuck.unknown("u-2")
    page = client_for(operator).get(f"/bulk/preview?op={_pick(first)}&op={_pick(second)}")
    assert page.context["count"] == 2 and page.context["by_hand"]


def test_a_viewer_sees_the_count_and_no_action(viewer, stuck):
    stuck.unknown("u-1")
    page = client_for(viewer).get("/bulk/preview")
    assert page.status_code == 200 and page.context["count"] == 1
    assert page.context["actions"] == []
    assert "take no bulk action" in page.content.decode()


def test_another_providers_operator_counts_none_of_them(outsider, stuck):
    stuck.unknown("u-1")
    page = client_for(outsider).get("/bulk/preview")
    assert page.context["count"] == 0


def test_anonymous_is_sent_to_sign_in(stuck):
    for path in ("/bulk/preview", "/batches/"):
        assert client_for(None).get(path)["Location"].startswith("/login/")
    assert client_for(None).post("/bulk/", {})["Location"].startswith("/login/")


def test_a_selection_above_the_limit_is_refused_with_a_clear_message(operator, stuck, settings):
    settings.SETTLE_BULK_MAX_ITEMS = 1
    stuck.unknown("u-1")
    stuck.unknown("u-2")
    client = client_for(operator)
    stuck.unknown("u-3")
    preview = client.get("/bulk/preview").content.decode()
    assert "more than a batch may hold (1 operations)" in preview
    # Counted up to the limit and one more: past it the number is no use to anyone.
    assert "<strong data-bulk-count>More than 1</strong>" in preview
    refused = _submit(client, "lookup", until="")
    assert refused.status_code == 400
    assert "a batch holds at most 1" in refused.content.decode()
    assert not BulkBatch.objects.exists()


def test_an_empty_or_malformed_selection_or_no_reason_is_refused_and_nothing_is_made(
    operator, stuck
):
    operation = stuck.unknown("u-1")
    client = client_for(operator)
    empty = _submit(client, "lookup", state="reconcile")  # nothing in reconcile
    assert empty.status_code == 400 and "nothing was selected" in empty.content.decode()
    forged = _submit(client, "lookup", ["1.x", "'; drop table"])
    assert forged.status_code == 400
    assert "not an operation" in forged.content.decode()
    no_reason = client.post("/bulk/", {"action": "lookup", "op": [_pick(operation)], "why": " "})
    assert no_reason.status_code == 400 and "give a reason" in no_reason.content.decode()
    unknown_action = _submit(client, "explode", [_pick(operation)])
    assert unknown_action.status_code == 400
    assert not BulkBatch.objects.exists()


# -- submitting -------------------------------------------------------------------------


def test_an_operator_confirms_all_that_match_and_reads_the_report(operator, stuck):
    matched = _matched(stuck)
    mismatch = stuck.mismatch("x-1")
    client = client_for(operator)
    preview = client.get("/bulk/preview?state=reconcile")
    assert preview.context["count"] == 3
    until = preview.context["until"]
    stuck.conflict("late", host_says="failed", provider_says="committed")  # after the count
    response = _submit(client, "confirm", state="reconcile", until=until)
    batch = _batch()
    assert response.status_code == 302 and response["Location"] == f"/batches/{batch.pk}/"
    assert batch.total == 3  # what arrived after the count is not swept in
    assert "state=reconcile" in batch.selection

    run_batch(batch)
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert "3 of 3 items settled" in " ".join(page.split()).replace("<strong>", "").replace(
        "</strong>", ""
    )
    assert "not_backed" in page
    for operation in matched:
        assert Operation.objects.get(pk=operation.pk).state == "released"
    assert Operation.objects.get(pk=mismatch.pk).state == "reconcile"

    report = client.get(f"/batches/{batch.pk}/report.csv")
    assert report["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(report.streaming_content).decode())))
    assert sorted((row["operation_key"], row["status"], row["code"]) for row in rows) == [
        ("m-0", "done", "confirmed"),
        ("m-1", "done", "confirmed"),
        ("x-1", "refused", "not_backed"),
    ]


def test_a_viewer_may_not_submit(viewer, stuck):
    operation = stuck.unknown("u-1")
    assert _submit(client_for(viewer), "lookup", [_pick(operation)]).status_code == 403
    assert not BulkBatch.objects.exists()


def test_submitting_needs_the_csrf_token(operator, stuck):
    operation = stuck.unknown("u-1")
    client = client_for(operator, csrf_checks=True)
    assert _submit(client, "lookup", [_pick(operation)]).status_code == 403
    assert not BulkBatch.objects.exists()


def test_a_forged_id_of_another_provider_is_refused_and_recorded_in_the_report(
    outsider, stuck, other_stuck
):
    theirs = stuck.conflict("m-1", host_says="failed", provider_says="committed")
    own = other_stuck.conflict("t-1", host_says="failed", provider_says="committed")
    client = client_for(outsider)
    _submit(client, "confirm", [_pick(theirs), _pick(own)])
    batch = _batch()
    run_batch(batch)
    assert Operation.objects.get(pk=theirs.pk).state == "reconcile"
    assert Operation.objects.get(pk=own.pk).state == "released"
    item = BulkItem.objects.get(batch=batch, operation_ref=theirs.pk)
    assert (item.status, item.code) == ("refused", "unknown_operation")
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert "unknown_operation" in page
    assert "m-1" not in page  # the key of an operation they may not see is never shown


def test_a_stale_pick_is_refused_for_that_item_only(operator, stuck):
    stale, fresh = _matched(stuck)
    _submit(client_for(operator), "confirm", [_pick(stale, stale.version - 1), _pick(fresh)])
    run_batch(_batch())
    codes = dict(BulkItem.objects.values_list("operation_ref", "code"))
    assert codes == {stale.pk: "stale_version", fresh.pk: "confirmed"}
    [refusal] = AuditEvent.objects.filter(operation_key=stale.key, kind="operator_refused")
    assert refusal.data["code"] == "stale_version"
    assert refusal.data["batch"] == str(_batch().pk)


# -- the batch's page --------------------------------------------------------------------


def test_the_batch_is_hidden_from_another_providers_operator(operator, outsider, stuck):
    operation = stuck.unknown("u-1")
    _submit(client_for(operator), "lookup", [_pick(operation)])
    batch = _batch()
    client = client_for(outsider)
    for path in (f"/batches/{batch.pk}/", f"/batches/{batch.pk}/report.csv"):
        assert client.get(path).status_code == 404
    assert batch.short_id not in client.get("/batches/").content.decode()


def test_a_viewer_of_the_provider_reads_the_batch(operator, viewer, stuck):
    operation = stuck.unknown("u-1")
    _submit(client_for(operator), "lookup", [_pick(operation)])
    batch = _batch()
    assert client_for(viewer).get(f"/batches/{batch.pk}/").status_code == 200
    assert batch.short_id in client_for(viewer).get("/batches/").content.decode()


def test_the_progress_polls_while_running_and_reloads_the_page_when_over(operator, stuck):
    operation = stuck.unknown("u-1")
    client = client_for(operator)
    _submit(client, "lookup", [_pick(operation)])
    batch = _batch()
    running = client.get(f"/batches/{batch.pk}/?part=progress", HTTP_HX_REQUEST="true")
    assert 'hx-trigger="every 1s"' in running.content.decode()
    assert "HX-Refresh" not in running
    run_batch(batch)
    over = client.get(f"/batches/{batch.pk}/?part=progress", HTTP_HX_REQUEST="true")
    assert over["HX-Refresh"] == "true"
    assert "every 1s" not in over.content.decode()


def test_the_operation_page_names_the_batch_on_its_events(operator, stuck):
    [operation] = _matched(stuck, 1)
    client = client_for(operator)
    _submit(client, "confirm", [_pick(operation)])
    batch = _batch()
    run_batch(batch)
    page = client.get(f"/operations/{operation.key}/").content.decode()
    assert f'href="/batches/{batch.pk}/"' in page
    assert f"in batch {str(batch.pk)[:8]}" in page


# -- four eyes -------------------------------------------------------------------------


@pytest.fixture
def second_supervisor(provider: Provider) -> User:
    return console_user("sue", "supervisor", provider)


def _proposed(supervisor, stuck) -> tuple[BulkBatch, Operation]:
    operation = stuck.mismatch("x-1")
    response = _submit(client_for(supervisor), "void", [_pick(operation)])
    assert response.status_code == 302
    batch = _batch()
    assert batch.status == "proposed"
    return batch, operation


def test_a_second_supervisor_approves_a_void_batch_and_it_runs(
    supervisor, second_supervisor, stuck
):
    batch, operation = _proposed(supervisor, stuck)
    client = client_for(second_supervisor)
    assert "Approve all 1 voids" in client.get(f"/batches/{batch.pk}/").content.decode()
    response = client.post(f"/batches/{batch.pk}/approve", {"reason": "ledger checked"})
    assert response.status_code == 302
    batch.refresh_from_db()
    assert batch.status == "running"
    run_batch(batch)
    assert Operation.objects.get(pk=operation.pk).state == "voided"


def test_the_proposer_may_not_approve_their_own_void_batch(supervisor, stuck):
    batch, operation = _proposed(supervisor, stuck)
    client = client_for(supervisor)
    assert "Approve all" not in client.get(f"/batches/{batch.pk}/").content.decode()
    page = client.post(f"/batches/{batch.pk}/approve", {"reason": "mine"}, follow=True)
    assert "you proposed this batch" in page.content.decode()
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"
    assert Operation.objects.get(pk=operation.pk).state == "reconcile"


def test_an_operator_or_viewer_may_not_approve(supervisor, operator, viewer, stuck):
    batch, _ = _proposed(supervisor, stuck)
    for user in (operator, viewer):
        response = client_for(user).post(f"/batches/{batch.pk}/approve", {"reason": "ok"})
        assert response.status_code == 403
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"


def test_another_providers_operator_gets_404_anonymous_signs_in_csrf_is_required(
    supervisor, second_supervisor, outsider, stuck
):
    batch, _ = _proposed(supervisor, stuck)
    path = f"/batches/{batch.pk}/approve"
    assert client_for(outsider).post(path, {"reason": "ok"}).status_code == 404
    assert client_for(None).post(path, {"reason": "ok"})["Location"].startswith("/login/")
    guarded = client_for(second_supervisor, csrf_checks=True)
    assert guarded.post(path, {"reason": "ok"}).status_code == 403
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"


def test_a_void_batch_rejected_as_a_whole_touches_nothing(supervisor, second_supervisor, stuck):
    batch, operation = _proposed(supervisor, stuck)
    client = client_for(second_supervisor)
    client.post(f"/batches/{batch.pk}/reject", {"reason": "not yet"})
    batch.refresh_from_db()
    assert batch.status == "rejected"
    assert Operation.objects.get(pk=operation.pk).state == "reconcile"
    page = client.get(f"/batches/{batch.pk}/").content.decode()
    assert "rejected" in page and "not yet" in page
