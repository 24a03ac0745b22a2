"""The customer pages' browser fixtures: Debian's Chromium and a page on the live server."""

from __future__ import annotations

from tests.support.browser import browser, page

__all__ = ["browser", "page"]
