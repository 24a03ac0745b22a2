"""Passkeys in a real browser: Chromium's virtual authenticator over the DevTools
protocol, never a mocked ceremony. WebAuthn wants a secure context: the live server is
reached as http://localhost (pytest-django's default host)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from allauth.mfa.models import Authenticator as Passkey
from django.contrib.auth.models import User
from fido2 import cbor
from fido2.cose import CoseKey
from fido2.utils import websafe_decode
from playwright.sync_api import Page, expect

from audit.kinds import AuditKind
from audit.models import AuditEvent
from tests.support.browser import passkey_register_in, screenshots_everywhere, sign_in
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_for_path(page: Page, path: str) -> None:
    page.wait_for_url(lambda url: urlsplit(url).path == path)


def _sign_out(page: Page) -> None:
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/login/"))


def _signed_in_as(page: Page) -> str:
    """Who the console says is signed in ("" when nobody is)."""
    page.goto("/")
    who = page.locator("header .who")
    return who.inner_text() if who.count() else ""


def _last(kind: AuditKind) -> AuditEvent:
    event = AuditEvent.objects.filter(kind=kind).order_by("id").last()
    assert event is not None, f"no {kind} event"
    return event


def test_passkey_registered_signs_in_alone_and_is_removed(page: Page, authenticator, operator):
    sign_in(page, operator.username)
    passkey_register_in(page, "Work laptop")
    row = page.locator("[data-passkeys] tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("Work laptop")
    expect(page.locator(".notice.success")).to_have_text("Passkey registered.")
    screenshots_everywhere(page, "passkeys-list")

    passkey = Passkey.objects.get(user=operator, type=Passkey.Type.WEBAUTHN)
    added = _last(AuditKind.PASSKEY_ADDED)
    assert added.data["user"] == operator.username
    assert added.data["user_id"] == operator.pk
    assert added.data["authenticator_id"] == passkey.pk
    assert added.data["name"] == "Work laptop"
    stored = passkey.wrap().authenticator_data.credential_data
    assert websafe_decode(added.data["credential_id"]) == stored.credential_id
    public_key = CoseKey.parse(cbor.decode(websafe_decode(added.data["public_key"])))
    assert dict(public_key) == dict(stored.public_key)
    # The browser's own copy of the passkey is the one the log holds.
    (credential,) = authenticator.credentials()
    assert credential["isResidentCredential"] is True
    assert websafe_decode(credential["credentialId"]) == stored.credential_id

    _sign_out(page)
    screenshots_everywhere(page, "sign-in-with-passkey")
    page.get_by_role("button", name="Sign in with a passkey").click()
    _wait_for_path(page, "/")
    expect(page.locator("header .who")).to_have_text(operator.username)
    signed_in = _last(AuditKind.SIGNED_IN)
    assert signed_in.data["user"] == operator.username
    assert signed_in.data["method"] == "passkey"

    page.get_by_role("link", name="Passkeys").click()
    page.click("[data-passkeys] [data-remove]")
    expect(page.get_by_role("heading", name="Remove a passkey")).to_be_visible()
    page.get_by_role("button", name="Remove").click()
    page.wait_for_url(re.compile(r"/accounts/2fa/webauthn/$"))
    expect(page.locator("[data-passkeys]")).to_have_count(0)
    expect(page.get_by_text("No passkeys yet.")).to_be_visible()
    removed = _last(AuditKind.PASSKEY_REMOVED)
    assert removed.data == {
        "user": operator.username,
        "user_id": operator.pk,
        "authenticator_id": passkey.pk,
        "name": "Work laptop",
        "credential_id": added.data["credential_id"],
    }
    assert not Passkey.objects.filter(user=operator).exists()


def test_authenticator_that_cannot_verify_its_user_registers_nothing(page: Page, device, operator):
    device.plug(hasUserVerification=False, isUserVerified=False)
    sign_in(page, operator.username)
    page.get_by_role("link", name="Passkeys").click()
    page.click("[data-add-passkey]")
    # What the server asks for (the browser then refuses this authenticator itself).
    options = json.loads(page.locator("#js_data").inner_text())["creation_options"]
    assert options["publicKey"]["authenticatorSelection"]["userVerification"] == "required"
    with page.expect_event("console", lambda m: m.type == "error") as refused:
        page.get_by_role("button", name="Register").click()
    assert "NotAllowedError" in refused.value.text, refused.value.text
    page.goto("/accounts/2fa/webauthn/")
    expect(page.get_by_text("No passkeys yet.")).to_be_visible()
    assert not Passkey.objects.filter(user=operator).exists()
    assert not AuditEvent.objects.filter(kind=AuditKind.PASSKEY_ADDED).exists()


def test_passkey_not_unlocked_signs_nobody_in(page: Page, authenticator, operator):
    sign_in(page, operator.username)
    passkey_register_in(page, "Phone")
    _sign_out(page)
    authenticator.user_verified(False)
    with page.expect_event("console", lambda m: m.type == "error") as refused:
        page.get_by_role("button", name="Sign in with a passkey").click()
    assert "NotAllowedError" in refused.value.text, refused.value.text
    assert _signed_in_as(page) == ""
    assert page.url.endswith("/login/?next=/")
    assert AuditEvent.objects.filter(kind=AuditKind.SIGNED_IN).count() == 1  # the password's


def test_supervisor_held_until_they_register_and_use_a_passkey(
    page: Page, authenticator, settings, provider, operator
):
    settings.SETTLE_REQUIRE_PASSKEY_FOR = ("supervisor",)
    supervisor = console_user("sasha", "supervisor", provider)
    sign_in(page, supervisor.username)
    expect(page).to_have_url(re.compile(r"/passkey-required/$"))
    expect(page.get_by_role("heading", name="Passkey required")).to_be_visible()
    screenshots_everywhere(page, "passkey-required")
    page.goto("/reconciliations/")
    expect(page).to_have_url(re.compile(r"/passkey-required/$"))

    page.click("[data-add-passkey]")
    page.fill("#id_name", "Security key")
    page.get_by_role("button", name="Register").click()
    page.wait_for_url(re.compile(r"/accounts/2fa/webauthn/$"))
    page.goto("/")  # registered, not yet used: still held
    expect(page).to_have_url(re.compile(r"/passkey-required/$"))
    expect(page.locator("[data-use-passkey]")).to_be_visible()
    screenshots_everywhere(page, "passkey-required-registered")
    page.click("[data-use-passkey]")
    page.get_by_role("button", name="Use my passkey").click()
    _wait_for_path(page, "/")
    expect(page.get_by_role("link", name="Reconciliations")).to_be_visible()
    page.goto("/reconciliations/")
    expect(page).to_have_url(re.compile(r"/reconciliations/$"))

    # Next time, the password is followed by the passkey (allauth's second step).
    _sign_out(page)
    page.fill("#id_login", supervisor.username)
    page.fill("#id_password", "a-password-for-tests-only")
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url(re.compile(r"/accounts/2fa/authenticate/$"))
    screenshots_everywhere(page, "passkey-second-step")
    page.get_by_role("button", name="Use my passkey").click()
    _wait_for_path(page, "/")
    expect(page.locator("header .who")).to_have_text(supervisor.username)
    assert _last(AuditKind.SIGNED_IN).data["method"] == "password"

    _sign_out(page)
    sign_in(page, operator.username)
    expect(page).to_have_url(re.compile(r"/$"))
    assert User.objects.get(pk=operator.pk).is_active
