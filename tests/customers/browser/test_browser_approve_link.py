"""The approval link on a phone (Chromium at 390 px): approve, decline with a reason,
expired and used links, two tabs racing, the page in German; each screenshotted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from approvals.models import Approval
from common.links import approval_link_token
from recovery.models import Host, Operation
from tests.support.browser import PHONE, assert_no_overflow, screenshot, screenshots_everywhere
from tests.support.customers import customer_open, customer_policy_apply
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened(flow):
    customer_policy_apply()
    Host.objects.filter(name="fleet-a").update(display_name="Acme Payments")
    return customer_open(flow)


def _open(page: Page, approval_id: str) -> Page:
    page.set_viewport_size(PHONE)
    page.goto(f"/approve/#{approval_link_token(approval_id)}")
    expect(page.locator("[data-stage]")).to_be_visible()
    return page


def test_the_customer_approves_on_their_phone(page: Page, opened):
    _open(page, opened["approval_id"])
    expect(page.locator(".customer-asker")).to_have_text("Acme Payments asks for your approval")
    expect(page.locator(".customer-summary")).to_have_text("Pay €1,250.00 to acct-7")
    assert_no_overflow(page)
    page.get_by_text("Details").click()
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    expect(page.locator(".customer-digest")).to_have_text(digest)
    screenshots_everywhere(page, "customer-approve")
    page.set_viewport_size(PHONE)
    page.get_by_role("button", name="Approve").click()
    expect(page.locator('[data-outcome="approved"]')).to_be_visible()
    screenshot(page, "customer-approved-390")
    assert Operation.objects.get(key="op-1").state == "approved"


def test_the_customer_declines_with_a_reason(page: Page, opened):
    _open(page, opened["approval_id"])
    page.fill("#reason", "I did not ask for this")
    page.get_by_role("button", name="Decline").click()
    expect(page.locator('[data-outcome="denied"]')).to_be_visible()
    screenshot(page, "customer-declined-390")
    approval = Approval.objects.get(pk=opened["approval_id"])
    assert approval.status == "denied" and approval.decision_reason == "I did not ask for this"


def test_an_expired_link_says_so_and_offers_no_decision(page: Page, opened):
    Approval.objects.filter(pk=opened["approval_id"]).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )
    _open(page, opened["approval_id"])
    expect(page.locator('[data-outcome="expired"]')).to_contain_text("expired")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    screenshot(page, "customer-expired-390")


def test_a_used_link_says_how_it_was_decided(page: Page, opened):
    _open(page, opened["approval_id"]).get_by_role("button", name="Approve").click()
    expect(page.locator('[data-outcome="approved"]')).to_be_visible()
    page.reload()
    expect(page.locator('[data-outcome="approved"]')).to_be_visible()
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)


def test_a_bad_link_says_so(page: Page, opened):
    page.set_viewport_size(PHONE)
    page.goto("/approve/#not-a-token")
    expect(page.locator('[data-code="link_invalid"]')).to_be_visible()
    screenshot(page, "customer-bad-link-390")


def test_two_tabs_racing_one_decision_the_other_told(page: Page, opened):
    other = page.context.new_page()
    _open(page, opened["approval_id"])
    _open(other, opened["approval_id"])
    page.get_by_role("button", name="Approve").click()
    expect(page.locator('[data-outcome="approved"]')).to_be_visible()
    other.get_by_role("button", name="Decline").click()
    expect(other.locator('[data-code="already_decided"]')).to_be_visible()
    expect(other.locator('[data-outcome="approved"]')).to_be_visible()
    screenshot(other, "customer-already-decided-390")
    assert Approval.objects.get(pk=opened["approval_id"]).status == "approved"


def test_the_page_in_the_browsers_language(browser: Browser, live_server, opened):
    context = browser.new_context(
        base_url=live_server.url, viewport=PHONE, locale="de-DE", color_scheme="light"
    )
    try:
        page = _open(context.new_page(), opened["approval_id"])
        expect(page.locator(".customer-asker")).to_have_text(
            "Acme Payments bittet um Ihre Zustimmung"
        )
        expect(page.get_by_role("button", name="Zustimmen")).to_be_visible()
        expect(page.locator(".customer-summary")).to_contain_text("1.250,00")
        screenshot(page, "customer-approve-de-390")
    finally:
        context.close()


def test_customer_and_staff_the_customer_is_told_staff_decide_too(page: Page, flow):
    customer_policy_apply()
    opened = customer_open(flow, "op-2", params={**PARAMS, "currency": "GBP"})
    _open(page, opened["approval_id"]).get_by_role("button", name="Approve").click()
    expect(page.locator('[data-outcome="approve"]')).to_contain_text("You approved.")
    screenshot(page, "customer-voted-390")
