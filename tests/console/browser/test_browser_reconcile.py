"""Four eyes in a real browser: an operator proposes a void, a supervisor approves it."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from approvals.models import ReconciliationRequest
from recovery.models import Operation
from tests.support.browser import WIDE, screenshot, screenshots_everywhere, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def _as(browser: Browser, live_server, username: str) -> Page:
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": WIDE, "height": 800}, color_scheme="light"
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, username)
    return page


def test_an_operator_proposes_a_void_and_a_supervisor_approves_it(
    browser: Browser, live_server, operator, supervisor, stuck
):
    operation = stuck.mismatch("pay-2026-000121")
    olivia = _as(browser, live_server, "olivia")
    olivia.goto(f"/operations/{operation.key}/")
    olivia.fill("#id_reason_void", "customer cancelled; the provider's record is another order")
    olivia.get_by_role("button", name="Propose void").click()
    # Asked first, with what it will do; nothing is done yet.
    expect(olivia.locator("h1")).to_have_text("Propose voiding pay-2026-000121?")
    expect(olivia.locator(".consequences")).to_contain_text("Nothing changes yet.")
    assert not ReconciliationRequest.objects.exists()
    screenshots_everywhere(olivia, "operation-void-asked-proposal")
    olivia.get_by_role("button", name="Propose the void").click()
    expect(olivia.locator(".notice.success")).to_contain_text("waits for a second operator")
    expect(olivia.locator(".proposal")).to_contain_text("cannot approve your own proposal")
    screenshot(olivia, "operation-proposed-void")

    sam = _as(browser, live_server, "sam")
    sam.get_by_role("link", name="Reconciliations").click()
    card = sam.locator(f"#request-{ReconciliationRequest.objects.get().pk}")
    expect(card).to_contain_text("customer cancelled")
    expect(card).to_contain_text("mismatch")
    screenshots_everywhere(sam, "reconciliations")
    card.get_by_label("Reason").fill("confirmed with the customer by phone")
    card.get_by_role("button", name="Approve void").click()
    expect(sam.locator(".notice.success")).to_contain_text("Approved and done")
    expect(sam.locator(".empty")).to_contain_text("No proposals wait")
    assert Operation.objects.get(pk=operation.pk).state == "voided"

    olivia.reload()
    expect(olivia.locator(".page-head .badge").first).to_have_text("voided")
    olivia.context.close()
    sam.context.close()


def test_an_operator_confirms_an_operation_whose_evidence_matches(page: Page, operator, stuck):
    """The host said failed, the provider's record says committed: the evidence backs it."""
    operation = stuck.conflict("pay-2026-000130", host_says="failed", provider_says="committed")
    sign_in(page, "olivia")
    page.goto(f"/operations/{operation.key}/")
    expect(page.get_by_role("button", name="Propose confirm")).to_have_count(0)
    page.fill("#id_reason_confirm", "the provider's record shows the payment")
    page.get_by_role("button", name="Confirm", exact=True).click()
    expect(page.locator(".notice.success")).to_have_text("Confirmed: the operation is released.")
    expect(page.locator(".page-head .badge").first).to_have_text("released")
    assert Operation.objects.get(pk=operation.pk).state == "released"


def test_a_void_is_asked_about_then_done_without_javascript(
    browser: Browser, live_server, operator, stuck
):
    """The provider's record says the effect failed: the evidence backs the void."""
    operation = stuck.conflict("pay-2026-000131", host_says="committed", provider_says="failed")
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": WIDE, "height": 800},
        color_scheme="light",
        java_script_enabled=False,
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    sign_in(page, "olivia")
    page.goto(f"/operations/{operation.key}/")
    page.fill("#id_reason_void", "the provider's record shows the payment failed")
    page.get_by_role("button", name="Void").click()
    expect(page.locator("h1")).to_have_text("Void pay-2026-000131?")
    expect(page.locator(".consequences")).to_contain_text("never dispatched again")
    assert Operation.objects.get(pk=operation.pk).state == "reconcile"
    screenshots_everywhere(page, "operation-void-asked")
    page.get_by_role("button", name="Void it").click()
    expect(page.locator(".notice.success")).to_have_text("Voided: the operation is voided.")
    expect(page.locator(".page-head .badge").first).to_have_text("voided")
    context.close()
