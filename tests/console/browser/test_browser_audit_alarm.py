"""An audit alarm in a real browser: the red banner follows a supervisor everywhere until
they resolve it, and an operator never sees it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from audit.chain import audit_append, audit_transaction
from audit.checkpoints import audit_checkpoint
from audit.models import AuditAlarm
from recovery.models import Operation
from recovery.services.locking import operation_lock
from tests.support.audit import chain_forge
from tests.support.browser import screenshots_everywhere, sign_in
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broken(stuck, provider):
    console_user("sue", "supervisor", provider)
    console_user("otto", "operator", provider)
    stuck.unknown("pay-2026-000117")
    audit_checkpoint()
    chain_forge("pay-2026-000117")
    with audit_transaction():
        locked = operation_lock(Operation.objects.get(key="pay-2026-000117"))
        audit_append(kind="test", operation=locked)
    audit_checkpoint()
    return AuditAlarm.objects.get()


def test_a_supervisor_sees_the_banner_everywhere_and_resolves_the_alarm(page: Page, broken):
    sign_in(page, "sue")
    banner = page.locator("[data-audit-alarms]")
    expect(banner).to_contain_text("Audit log broken.")
    expect(banner).to_contain_text("pay-2026-000117")
    screenshots_everywhere(page, "audit-alarm-banner")
    page.click("nav >> text=Reconciliations")
    expect(banner).to_be_visible()
    banner.locator("text=Review and resolve").click()
    expect(page).to_have_url(re.compile(r"/audit/#alarms$"))
    alarm = page.locator(f'[data-alarm="{broken.pk}"]')
    expect(alarm).to_contain_text("differs from what checkpoint #1 signed (rewritten)")
    screenshots_everywhere(page, "audit-alarm-resolve")
    alarm.locator("textarea").fill("Restored the chain from last night's backup; reported.")
    alarm.locator("button", has_text="Resolve alarm").click()
    expect(page.locator(".notice.success")).to_contain_text(f"Alarm {broken.pk} resolved.")
    expect(banner).to_have_count(0)
    page.goto("/")
    expect(banner).to_have_count(0)


def test_an_operator_never_sees_the_banner(page: Page, broken):
    sign_in(page, "otto")
    expect(page.locator("h1")).to_be_visible()
    expect(page.locator("[data-audit-alarms]")).to_have_count(0)
