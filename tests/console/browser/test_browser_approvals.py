"""The approver's side in a real browser: the inbox on a phone, by keyboard, and deciding."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import Approval, ApprovalVote
from common.actors import Actor
from policies.services import policy_apply
from recovery.models import Operation
from tests.support.browser import assert_no_overflow, screenshot, screenshots_everywhere, sign_in
from tests.support.console import console_user, pending_approval

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def decider(provider):
    return console_user("dora", "decide_approvals", provider)


@pytest.fixture
def inbox(flow, supervisor):
    """Three approvals waiting: a plain one, a large nested one under a two-person rule
    with one vote in, and a refund that expires soon."""
    now = timezone.now()
    first = pending_approval(flow, "pay-2026-000117")
    large = pending_approval(
        flow,
        "pay-2026-000121-with-a-rather-long-operation-key",
        params={
            "amount": 48_000_00,
            "currency": "EUR",
            "beneficiary": {
                "name": "Müller Anlagenbau GmbH & Co. KG",
                "accounts": [{"iban": "DE89 3704 0044 0532 0130 00", "bic": "COBADEFFXXX"}],
            },
            "memo": "Invoice 2026-1142 — second instalment of the plant order; "
            "see the contract of 2026-03-01, schedule B, for the terms agreed. " * 3,
        },
        rule="large-payment",
        rule_reason="payments over 10,000 EUR need two people",
        policy_version="sha256:" + "c" * 64,
        required=2,
        groups=[],
        expires_at=now + timedelta(hours=4),
    )
    ApprovalVote.objects.create(
        approval=large,
        voter=Actor.of("user", supervisor),
        voter_identity=Actor.of("user", supervisor).identity,
        approve=True,
        reason="matches the invoice",
        params_digest=large.params_digest,
        at=now - timedelta(minutes=20),
    )
    refund = pending_approval(flow, "refund-2026-000007", params={"order": "o-7", "amount": 15})
    Approval.objects.filter(pk=refund.pk).update(
        action="refund.issue", expires_at=now + timedelta(minutes=9)
    )
    Operation.objects.filter(key=refund.operation_key).update(action="refund.issue")
    for approval, minutes in ((first, 95), (large, 48), (refund, 12)):
        Approval.objects.filter(pk=approval.pk).update(created_at=now - timedelta(minutes=minutes))
    return [first, large, refund]


def rows(page: Page):
    return page.locator("[data-queue] tbody tr")


def test_on_a_phone_a_decider_keyboards_to_an_approval_and_approves_it(page: Page, decider, inbox):
    page.set_viewport_size(PHONE)
    sign_in(page, "dora")
    page.click("nav >> text=Approvals")
    expect(page).to_have_url(re.compile(r"/approvals/$"))
    expect(rows(page)).to_have_count(3)
    expect(rows(page).nth(1)).to_contain_text("1 of 2")
    links = rows(page).locator("a")
    page.keyboard.press("j")
    expect(links.nth(0)).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(links.nth(2)).to_be_focused()
    page.keyboard.press("k")
    page.keyboard.press("k")
    expect(links.nth(0)).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"/approvals/{inbox[0].pk}/$"))
    expect(page.locator("h1")).to_have_text("payment.send")
    page.fill("#id_reason", "expected payout")
    page.click("button[value=approve]")
    expect(page.locator(".notice.success")).to_contain_text("Approved: a permit is issued")
    expect(page.locator(".page-head .badge")).to_have_text("approved")
    assert Operation.objects.get(key="pay-2026-000117").state == "approved"
    assert_no_overflow(page)
    screenshot(page, "approval-approved-light-390")
    page.goto("/approvals/")
    expect(rows(page)).to_have_count(2)


def test_the_inbox_follows_approvals_that_arrive_and_keeps_the_focus(
    page: Page, decider, inbox, flow
):
    sign_in(page, "dora")
    page.goto("/approvals/")
    page.keyboard.press("j")
    page.keyboard.press("j")
    links = rows(page).locator("a")
    expect(links.nth(1)).to_be_focused()
    page.evaluate("window.notReloaded = true")
    arrived = pending_approval(flow, "pay-2026-000130")  # newest: last
    Approval.objects.filter(pk=inbox[0].pk).update(status=Approval.Status.DENIED)  # elsewhere
    # Named by its link, not its age: on a busy machine the next poll may come when
    # the new approval is already "5 s ago".
    expect(rows(page).last).to_have_attribute(
        "data-href", f"/approvals/{arrived.pk}/", timeout=15_000
    )
    expect(rows(page)).to_have_count(3)
    # The row in focus is still the large payment, now first; j goes on from it.
    expect(links.nth(0)).to_be_focused()
    page.keyboard.press("j")
    expect(links.nth(1)).to_be_focused()
    assert page.evaluate("window.notReloaded") is True


def test_screenshots_of_the_inbox_and_the_approval_page(page: Page, decider, inbox):
    sign_in(page, "dora")
    page.goto("/approvals/")
    expect(rows(page)).to_have_count(3)
    screenshots_everywhere(page, "approvals")
    page.goto(f"/approvals/{inbox[1].pk}/")
    expect(page.locator("h1")).to_have_text("payment.send")
    page.locator("details.long summary").first.click()
    screenshots_everywhere(page, "approval")
    page.set_viewport_size(PHONE)
    screenshot(page, "approval-phone-light-390")


def test_a_viewer_sees_the_approval_without_the_form(page: Page, viewer, inbox):
    sign_in(page, "victor")
    expect(page.locator("nav >> text=Approvals")).to_have_count(0)
    page.goto(f"/approvals/{inbox[1].pk}/")
    expect(page.locator("h1")).to_have_text("payment.send")
    expect(page.locator("button[value=approve]")).to_have_count(0)
    expect(page.locator("text=You may see this approval but not decide it.")).to_be_visible()


def test_the_inbox_loads_filters_and_polls_without_a_script_error(page: Page, decider, inbox):
    """htmx reads the inbox's triggers without complaint (a selector with a space in its
    ``from:`` was an ``htmx:syntax:error`` on every load), and typing in the filter asks
    for the rows again."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, "dora")
    page.goto("/approvals/")
    expect(rows(page)).to_have_count(3)
    with page.expect_response(re.compile(r"/approvals/\?.*action=refund")):
        page.locator(".filters input[name=action]").fill("refund")
    expect(rows(page)).to_have_count(1)
    assert errors == []


def test_the_action_in_plain_words_reads_well_on_a_phone_and_a_desk(page: Page, decider, flow):
    policy_apply(
        source=b'[[actions]]\nprovider = "orders"\naction = "payment.send"\n'
        b'summary = "Pay {/amount:money:/currency} to {/beneficiary/name} on {/on:date}"\n',
        actor=Actor.system("test"),
    )
    params = {
        "amount": "48000.00",
        "currency": "EUR",
        "beneficiary": {"name": "Müller Anlagenbau GmbH & Co. KG", "iban": "DE89 3704 0044"},
        "on": "2026-12-07",
    }
    said = pending_approval(flow, "pay-2026-000140", params=params)
    missing = pending_approval(flow, "pay-2026-000141", params={**params, "on": "Monday"})
    sign_in(page, "dora")
    page.goto("/approvals/")
    expect(rows(page).first.locator("[data-summary]")).to_have_text(
        "Pay €48,000.00 to Müller Anlagenbau GmbH & Co. KG on December 7, 2026"
    )
    screenshots_everywhere(page, "approvals-plain-words")
    page.goto(f"/approvals/{said.pk}/")
    expect(page.locator("p[data-summary]")).to_have_text(
        "Pay €48,000.00 to Müller Anlagenbau GmbH & Co. KG on December 7, 2026"
    )
    screenshots_everywhere(page, "approval-plain-words")
    page.set_viewport_size(PHONE)
    screenshot(page, "approval-plain-words-phone-light-390")
    page.goto(f"/approvals/{missing.pk}/")
    expect(page.locator("p[data-summary]")).to_contain_text(
        "Summary unavailable: /on is not an ISO 8601 date."
    )
    assert_no_overflow(page)
    screenshot(page, "approval-plain-words-unavailable-light-390")
