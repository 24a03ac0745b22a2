"""The customer pages' browser fixtures: Debian's Chromium, a page on the live server at a
phone's width, and Chromium's virtual authenticators (one phone, then another)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from tests.support.browser import PHONE, Authenticator, browser, page

__all__ = ["browser", "page"]


@pytest.fixture
def phone(page: Page) -> Page:
    page.set_viewport_size(PHONE)
    return page


@pytest.fixture
def authenticator(phone: Page) -> Authenticator:
    return Authenticator(phone).plug()
