"""Playwright driving Debian's Chromium against a live server.

Chromium comes from apt (``.ci/run`` installs it); Playwright's own browser download is
not used. A missing Chromium fails the browser tests: it never skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, WIDE


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
