"""The audit trail in a real browser: an auditor filters it, exports it, checks the file."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from playwright.sync_api import Page, expect

from audit.models import AuditEvent
from console.models import AuditExport
from console.services.audit_export import TRAILER, audit_export_run, export_file_check
from tests.support.audit import GENESIS, offline_hash
from tests.support.browser import (
    NARROW,
    WIDE,
    assert_no_overflow,
    screenshot,
    screenshots_everywhere,
    sign_in,
)
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def auditor(provider):
    """A supervisor of the orders provider: reads its operations and the system chain."""
    return console_user("audrey", "supervisor", provider)


@pytest.fixture
def trail(stuck, other_stuck):
    stuck.unknown("pay-2026-000117")
    stuck.mismatch("refund-2026-000007-with-a-rather-long-key")
    other_stuck.unknown("ledger-000042")
    call_command("verify_audit")


def rows(page: Page):
    return page.locator("[data-audit] tbody tr")


def test_an_auditor_filters_the_trail_and_verifies_its_export(page: Page, auditor, trail):
    sign_in(page, "audrey")
    page.click("nav >> text=Audit trail")
    expect(page).to_have_url(re.compile(r"/audit/$"))
    expect(page.locator("[data-audit-health]")).to_contain_text("verified intact")
    expect(page.locator("[data-audit-health]")).to_contain_text("Last checkpoint #1 signed")
    assert "ledger-000042" not in page.content()
    screenshots_everywhere(page, "audit-trail")
    screenshot(page, "audit-trail")

    page.evaluate("window.notReloaded = true")
    key = "refund-2026-000007-with-a-rather-long-key"
    page.fill("#id_key", key)
    chain = AuditEvent.objects.filter(operation_key=key)
    expect(rows(page)).to_have_count(chain.count())
    expect(page).to_have_url(re.compile(r"key=refund-2026-000007"))
    page.fill("#id_kind", "transition")
    expect(rows(page)).to_have_count(chain.filter(kind="transition").count())
    assert page.evaluate("window.notReloaded") is True  # htmx swapped the results only
    page.fill("#id_kind", "")
    expect(rows(page)).to_have_count(chain.count())
    for width in (WIDE, NARROW):
        page.set_viewport_size({"width": width, "height": 800})
        assert_no_overflow(page)
        screenshot(page, f"audit-trail-filtered-{width}")

    # The export is a job: its page follows the worker (run here in-process), then
    # offers the file.
    page.get_by_role("button", name="CSV", exact=True).click()
    expect(page).to_have_url(re.compile(r"/audit/exports/[0-9a-f-]{36}/$"))
    expect(page.locator("[data-export-status]")).to_have_text("queued")
    (export,) = AuditExport.objects.all()
    audit_export_run(export_id=str(export.pk))
    expect(page.locator("[data-export-status]")).to_have_text("done", timeout=5000)
    for width in (WIDE, NARROW):
        page.set_viewport_size({"width": width, "height": 800})
        assert_no_overflow(page)
        screenshot(page, f"audit-export-done-{width}")
    with page.expect_download() as download_info:
        page.get_by_role("link", name=re.compile(r"^Download")).click()
    download = download_info.value
    assert re.fullmatch(r"settle-audit-\d{8}T\d{6}Z\.csv", download.suggested_filename)
    assert export_file_check(path=Path(download.path())).complete
    with open(download.path(), encoding="utf-8", newline="") as handle:
        text = handle.read()
    exported = list(csv.DictReader(io.StringIO(text[: text.rindex(TRAILER)])))
    # The whole chain, in order, each hash recomputed from the file alone.
    assert [int(row["seq"]) for row in exported] == list(range(1, chain.count() + 1))
    previous = GENESIS
    for row in exported:
        assert row["chain"] == key
        assert row["prev_hash"] == previous and offline_hash(row) == row["hash"]
        previous = row["hash"]
    exports = AuditEvent.objects.filter(kind="audit_exported")
    assert list(exports.values_list("data", flat=True)) == [
        {"format": "csv", "filters": {"key": key}, "export": str(export.pk)}
    ]
