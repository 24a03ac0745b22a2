"""What the browser tests share: Debian's Chromium and a page on the live server (the
``browser`` and ``page`` fixtures), signing in, and screenshots checked for overflow at
two widths in both colour schemes.

Chromium comes from apt (``.ci/run`` installs it); Playwright's own browser download is
not used. A missing Chromium fails the browser tests: it never skips them.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, CDPSession, Page, sync_playwright

from harness.accounts import PASSWORD

CHROMIUM = os.environ.get("SETTLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
WIDE, NARROW = 1280, 390
PHONE = {"width": NARROW, "height": 844}

UNLOCKED = {
    "protocol": "ctap2",
    "transport": "internal",
    "hasResidentKey": True,
    "hasUserVerification": True,
    "isUserVerified": True,
    "automaticPresenceSimulation": True,
}


class Authenticator:
    """A platform authenticator Chromium emulates: its passkeys live as long as it does."""

    def __init__(self, page: Page) -> None:
        self.cdp: CDPSession = page.context.new_cdp_session(page)
        self.cdp.send("WebAuthn.enable")
        self.id = ""

    def plug(self, **options: Any) -> Authenticator:
        added = self.cdp.send(
            "WebAuthn.addVirtualAuthenticator", {"options": {**UNLOCKED, **options}}
        )
        self.id = added["authenticatorId"]
        return self

    def user_verified(self, verified: bool) -> None:
        """Whether the owner unlocks it (PIN, fingerprint) when asked."""
        self.cdp.send(
            "WebAuthn.setUserVerified", {"authenticatorId": self.id, "isUserVerified": verified}
        )

    def credentials(self) -> list[dict[str, Any]]:
        found = self.cdp.send("WebAuthn.getCredentials", {"authenticatorId": self.id})
        return list(found["credentials"])


def passkey_register_in(page: Page, name: str) -> None:
    """Register a passkey named ``name`` from the console's passkeys page (the page's
    authenticator answers: Chromium's virtual one in these tests)."""
    page.get_by_role("link", name="Passkeys").click()
    page.click("[data-add-passkey]")
    page.fill("#id_name", name)
    page.get_by_role("button", name="Register").click()
    page.wait_for_url(re.compile(r"/accounts/2fa/webauthn/$"))


def base64url_of(text: str) -> str:
    """Base64url without padding of Chromium's base64 (the virtual authenticator's ids)."""
    return base64.urlsafe_b64encode(base64.b64decode(text)).decode().rstrip("=")


def sign_in(page: Page, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_login", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def assert_no_overflow(page: Page) -> None:
    """Nothing sticks out sideways: the page is no wider than the window."""
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    wide = page.evaluate(
        """[...document.querySelectorAll('*')]
            .filter(e => e.scrollWidth > document.documentElement.clientWidth)
            .slice(0, 8).map(e => e.tagName + '.' + e.className + ':' + e.scrollWidth)"""
    )
    assert widths[0] <= widths[1], f"page is {widths[0]}px wide in {widths[1]}px: {wide}"


def screenshots_everywhere(page: Page, name: str) -> None:
    """``name``-light/dark-1280/390: each checked for overflow; back to light and wide."""
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for width in (WIDE, NARROW):
            page.set_viewport_size({"width": width, "height": 800})
            assert_no_overflow(page)
            screenshot(page, f"{name}-{scheme}-{width}")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": WIDE, "height": 800})


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium is not at {CHROMIUM}: apt-get install -y chromium")
    # Playwright's sync API keeps an event loop on this thread, which Django's ORM takes
    # for async code; the ORM calls in these tests (fixtures) are plain synchronous ones.
    # Only while the browser runs (a module): a subprocess started later must not inherit
    # it, or its check --deploy fails (async.E001).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": WIDE, "height": 800}, color_scheme="light"
    )
    context.set_default_timeout(10_000)
    opened = context.new_page()
    yield opened
    context.close()
