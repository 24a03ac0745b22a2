"""The console's browser fixtures (Debian's Chromium, a page on the live server), and a
virtual authenticator plugged into it over the DevTools protocol."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from tests.support.browser import Authenticator, browser, page

__all__ = ["browser", "page"]


@pytest.fixture
def authenticator(page: Page) -> Authenticator:
    return Authenticator(page).plug()


@pytest.fixture
def device(page: Page) -> Authenticator:
    """An authenticator not plugged in yet: the test says how it behaves."""
    return Authenticator(page)
