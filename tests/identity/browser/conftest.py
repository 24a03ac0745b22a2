"""The console's browser fixtures (Debian's Chromium, a page on the live server), and a
virtual authenticator plugged into it over the DevTools protocol."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import CDPSession, Page

from tests.support.browser import browser, page

__all__ = ["browser", "page"]

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


@pytest.fixture
def authenticator(page: Page) -> Authenticator:
    return Authenticator(page).plug()


@pytest.fixture
def device(page: Page) -> Authenticator:
    """An authenticator not plugged in yet: the test says how it behaves."""
    return Authenticator(page)
