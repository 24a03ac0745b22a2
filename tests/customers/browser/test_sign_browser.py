"""A customer signs an approval on their phone with the passkey they enrolled from the
host's link: Chromium at 390 px with its virtual authenticator. Another phone, whose
passkey is not enrolled for this customer, decides nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from approvals.models import Approval, ApprovalVote
from audit.verify_walk import audit_verify
from tests.support.browser import PHONE, Authenticator, assert_no_overflow, screenshot
from tests.support.customers import customer_open, customer_policy_apply
from tests.support.flow import Api, Flow

pytestmark = pytest.mark.django_db(transaction=True)
SIGNED_PARAMS = {"amount": 9000, "currency": "EUR", "to": "acct-7"}


def _enrol(phone: Page, host_api: Api, party: str) -> None:
    answer = host_api.post(f"/api/v1/parties/{party}/enrolments", {"name": "Ada Lovelace"})
    phone.goto("/enrol/#" + answer.json()["url"].split("#", 1)[1])
    phone.get_by_role("button", name="Create passkey").click()
    expect(phone.locator("[data-enrolled]")).to_have_count(1)


def _approval_link(flow: Flow) -> str:
    customer_policy_apply()
    opened = customer_open(flow, params=SIGNED_PARAMS)
    return "/approve/#" + opened["link"].split("#", 1)[1]


@pytest.fixture
def other_phone(browser: Browser, live_server) -> Iterator[Page]:
    context = browser.new_context(base_url=live_server.url, viewport=PHONE)
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


def test_a_customer_signs_the_approval_with_their_passkey(
    phone: Page, authenticator: Authenticator, flow: Flow
):
    _enrol(phone, flow.host_api, "cust_8812")
    phone.goto(_approval_link(flow))
    expect(phone.locator(".customer-sign-note")).to_be_visible()
    assert_no_overflow(phone)
    screenshot(phone, "customer-sign-390")
    phone.get_by_role("button", name="Approve").click()
    expect(phone.locator("[data-outcome=approved]")).to_be_visible()
    screenshot(phone, "customer-signed-390")
    assert Approval.objects.get().status == "approved"
    (credential,) = authenticator.credentials()
    assert ApprovalVote.objects.get().signature["credential_id"]
    assert credential["signCount"] >= 1
    assert list(audit_verify()) == []


def test_another_phone_not_enrolled_for_this_customer_decides_nothing(
    phone: Page, authenticator: Authenticator, other_phone: Page, flow: Flow
):
    _enrol(phone, flow.host_api, "cust_8812")
    Authenticator(other_phone).plug()
    _enrol(other_phone, flow.host_api, "cust_other")  # a passkey, but another customer's
    link = _approval_link(flow)
    other_phone.goto(link)
    other_phone.get_by_role("button", name="Approve").click()
    expect(other_phone.locator("[data-refusal]")).to_contain_text(
        "Your passkey was not unlocked. Nothing was decided.", timeout=30_000
    )
    screenshot(other_phone, "customer-sign-other-phone-390")
    assert Approval.objects.get().status == "pending" and not ApprovalVote.objects.exists()
    # The customer's own phone still decides it.
    phone.goto(link)
    phone.get_by_role("button", name="Approve").click()
    expect(phone.locator("[data-outcome=approved]")).to_be_visible()


def test_a_customer_without_a_passkey_is_told_to_ask_the_app(phone: Page, flow: Flow):
    phone.goto(_approval_link(flow))
    expect(phone.locator("[data-code=party_no_passkey]")).to_contain_text("Ask the app")
    expect(phone.get_by_role("button", name="Approve")).to_have_count(0)
    screenshot(phone, "customer-sign-no-passkey-390")
