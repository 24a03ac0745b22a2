"""The browser tests' fixtures: Debian's Chromium and a page on the live server
(``tests.support.browser``, where the identity app's browser tests take them too)."""

from __future__ import annotations

from tests.support.browser import browser, page

__all__ = ["browser", "page"]
