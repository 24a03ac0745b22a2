"""A customer enrols a passkey on their phone from the host's enrolment link: Chromium at
390 px with its virtual authenticator, the link asked for through the host API."""

from __future__ import annotations

import pytest
from fido2.utils import websafe_decode
from playwright.sync_api import Page, expect

from approvals.models import PartyEnrolment, PartyPasskey
from audit.kinds import AuditKind
from audit.models import AuditEvent
from tests.support.browser import Authenticator, assert_no_overflow, screenshot
from tests.support.flow import Api

pytestmark = pytest.mark.django_db(transaction=True)


def _enrolment_link(host_api: Api) -> str:
    answer = host_api.post("/api/v1/parties/cust_8812/enrolments", {"name": "Ada Lovelace"})
    assert answer.status_code == 201, answer.content
    return "/enrol/#" + answer.json()["url"].split("#", 1)[1]


def test_a_customer_enrols_a_passkey_from_the_link(
    phone: Page, authenticator: Authenticator, host_api: Api
):
    link = _enrolment_link(host_api)
    phone.goto(link)
    expect(phone.locator("[data-enrol-name]")).to_have_text("Ada Lovelace")
    # The token leaves the address bar as soon as the page has read it.
    assert "#" not in phone.url
    assert_no_overflow(phone)
    screenshot(phone, "customer-enrol-390")
    phone.fill("#passkey-name", "Ada's phone")
    phone.get_by_role("button", name="Create passkey").click()
    expect(phone.locator("[data-enrol-status]")).to_have_text(
        "Passkey added. You can close this page and go back to the app."
    )
    screenshot(phone, "customer-enrol-done-390")
    passkey = PartyPasskey.objects.get()
    assert passkey.party.party == "cust_8812" and passkey.name == "Ada's phone"
    (credential,) = authenticator.credentials()
    assert websafe_decode(credential["credentialId"]) == websafe_decode(passkey.credential_id)
    added = AuditEvent.objects.get(kind=AuditKind.PARTY_PASSKEY_ADDED)
    assert added.data["public_key"] == passkey.public_key
    assert PartyEnrolment.objects.get().used_at is not None


def test_the_link_opened_again_says_it_was_used(
    phone: Page, authenticator: Authenticator, host_api: Api
):
    link = _enrolment_link(host_api)
    phone.goto(link)
    phone.get_by_role("button", name="Create passkey").click()
    expect(phone.locator("[data-enrolled]")).to_have_count(1)
    phone.goto("/")  # away, then the same link again (a second tab, a reload)
    phone.goto(link)
    expect(phone.locator("[data-enrol-error]")).to_have_attribute(
        "data-enrol-error", "enrolment_used"
    )
    expect(phone.get_by_role("button", name="Create passkey")).to_be_hidden()
    screenshot(phone, "customer-enrol-used-390")
    assert PartyPasskey.objects.count() == 1


def test_a_page_opened_without_a_link_asks_for_one(phone: Page):
    phone.goto("/enrol/")
    expect(phone.locator("[data-enrol-status]")).to_contain_text("opens from the link in your app")
