"""Bulk work in a real browser: pick operations in the queue, confirm them in one batch,
watch the progress and read the report, then download it as CSV.

The batch's chunks are done by the task's own body in this process
(``tests.support.console.run_batch``) while the page polls; a real worker is
in ``tests/integration/test_bulk_worker_killed.py``.
"""

from __future__ import annotations

import csv

import pytest
from playwright.sync_api import Page, expect

from bulk.models import BulkBatch
from recovery.models import Operation
from tests.support.browser import screenshot, screenshots_everywhere, sign_in
from tests.support.console import run_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _chunks_published_to_a_queue_of_this_test(settings, celery_queue: str) -> None:
    """Submitting publishes the batch's chunks; no worker reads this test's queue."""
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_queue


def test_an_operator_confirms_picked_operations_and_reads_the_report(
    page: Page, operator, stuck, tmp_path
):
    matched = [
        stuck.conflict(f"pay-2026-00{n}", host_says="failed", provider_says="committed")
        for n in range(140, 143)
    ]
    mismatch = stuck.mismatch("pay-2026-000150")
    sign_in(page, "olivia")
    page.goto("/?state=reconcile")
    expect(page.locator("[data-queue] tbody tr")).to_have_count(4)
    page.get_by_label("Select every operation on this page").check()
    expect(page.locator("[data-queue] tbody .pick input:checked")).to_have_count(4)
    screenshots_everywhere(page, "bulk-queue-selected")

    page.get_by_role("button", name="Act on selected…").click()
    expect(page.locator("h1")).to_have_text("Bulk action")
    expect(page.locator("[data-bulk-count]")).to_have_text("4")
    page.get_by_label("Confirm").check()
    page.get_by_label("Reason").fill("provider back after the outage")
    screenshots_everywhere(page, "bulk-preview")

    page.get_by_role("button", name="Submit 4 operations").click()
    batch = BulkBatch.objects.get()
    page.wait_for_url(f"**/batches/{batch.pk}/")
    expect(page.locator("[data-batch-status]")).to_have_text("running")
    screenshot(page, "bulk-batch-running")

    run_batch(batch)  # what the workers do; the page finds out by itself
    expect(page.locator("[data-batch-status]")).to_have_text("finished", timeout=15_000)
    report = page.locator(".bulk-report tbody tr")
    expect(report).to_have_count(4)
    expect(report.first).to_contain_text("not_backed")  # refusals first
    expect(page.locator(".bulk-progress")).to_contain_text("3 done")
    expect(page.locator(".bulk-progress")).to_contain_text("1 refused")
    screenshots_everywhere(page, "bulk-batch-report")
    for operation in matched:
        assert Operation.objects.get(pk=operation.pk).state == "released"
    assert Operation.objects.get(pk=mismatch.pk).state == "reconcile"

    with page.expect_download() as download:
        page.get_by_role("link", name="Download report (CSV)").click()
    saved = tmp_path / "report.csv"
    download.value.save_as(saved)
    with open(saved, newline="") as handle:
        rows = {
            row["operation_key"]: (row["status"], row["code"]) for row in csv.DictReader(handle)
        }
    assert rows == {
        **{op.key: ("done", "confirmed") for op in matched},
        mismatch.key: ("refused", "not_backed"),
    }

    page.get_by_role("link", name="Batches").first.click()
    expect(page.locator(".bulk-batches tbody tr")).to_have_count(1)
    screenshots_everywhere(page, "bulk-batches")
