"""What the browser tests share: Debian's Chromium, signing in, and screenshots checked
for overflow at two widths in both colour schemes."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Page

from tests.support.console import PASSWORD

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
