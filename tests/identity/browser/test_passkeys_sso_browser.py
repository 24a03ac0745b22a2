"""A passkey as the second step of single sign-on: allauth asks for it after the
identity provider's callback, and the sign-in still counts as single sign-on.

The tests' IdP (harness/idp) runs in a process of its own; Chromium goes there
and back as it would to a company's."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from audit.kinds import AuditKind
from audit.models import AuditEvent
from harness.accounts import PASSWORD
from harness.sso import sso_on
from settle.settings_identity import OidcProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


@pytest.fixture
def sso(settings, idp, live_server, tmp_path) -> OidcProvider:
    """Settle configured for the tests' IdP, as the SETTLE_OIDC_* names would."""
    provider = sso_on(settings, idp, tmp_path, base=live_server.url)
    idp.directory.person("alice", groups=["settle-operators"])
    return provider


def _path_is(path: str):
    return lambda url: urlsplit(url).path == path and urlsplit(url).hostname == "localhost"


def _single_sign_on(page: Page, idp) -> None:
    page.goto("/login/")
    page.click("[data-sso=sso]")
    page.wait_for_url(lambda url: url.startswith(idp.url) or "localhost" in url)
    if page.url.startswith(idp.url):  # not yet signed in at the IdP
        page.fill("input[name=login]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.locator("form:has(input[name=password]) [type=submit]").click()


def test_passkey_is_the_second_step_of_single_sign_on(page: Page, authenticator, sso, idp):
    _single_sign_on(page, idp)
    page.wait_for_url(_path_is("/"))
    expect(page.locator("header .who")).to_have_text("alice")
    first = AuditEvent.objects.filter(kind=AuditKind.SIGNED_IN).order_by("id").last()
    assert first is not None and first.data["method"] == "sso"

    # Just signed in: registering asks for nothing more (alice has no password to give).
    page.get_by_role("link", name="Passkeys").click()
    page.click("[data-add-passkey]")
    expect(page).to_have_url(re.compile(r"/accounts/2fa/webauthn/add/$"))
    page.get_by_role("button", name="Register").click()
    page.wait_for_url(_path_is("/accounts/2fa/webauthn/"))
    expect(page.locator("[data-passkeys] tbody tr")).to_have_count(1)

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(_path_is("/login/"))
    _single_sign_on(page, idp)
    page.wait_for_url(_path_is("/accounts/2fa/authenticate/"))
    page.get_by_role("button", name="Use my passkey").click()
    page.wait_for_url(_path_is("/"))
    expect(page.locator("header .who")).to_have_text("alice")

    second = AuditEvent.objects.filter(kind=AuditKind.SIGNED_IN).order_by("id").last()
    assert second is not None and second.pk != first.pk
    assert second.data["method"] == "sso"
    assert second.data["idp"] == "sso"
    assert second.data["subject"] == first.data["subject"]
    assert "break_glass" not in second.data
