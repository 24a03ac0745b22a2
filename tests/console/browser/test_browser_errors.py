"""The error pages in a real browser: styled like the console, light and dark, any width."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import screenshots_everywhere, sign_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_not_found_page(page: Page, operator):
    sign_in(page, "olivia")
    response = page.goto("/operations/nothing-here/")
    assert response is not None and response.status == 404
    expect(page.locator("h1")).to_have_text("Not found")
    screenshots_everywhere(page, "not-found")


@pytest.mark.urls("tests.console.urls_failing")
def test_server_error_page(page: Page, operator):
    sign_in(page, "olivia")
    response = page.goto("/fails/")
    assert response is not None and response.status == 500
    expect(page.locator("h1")).to_have_text("Something went wrong")
    # Styled: the stylesheet loaded (the header bar has its surface and border).
    assert page.locator(".bar").evaluate("e => getComputedStyle(e).borderBottomStyle") == "solid"
    screenshots_everywhere(page, "server-error")
    page.get_by_role("link", name="Back to the queue").click()
    expect(page.locator("h1")).to_have_text("Queue")


def test_forbidden_page_says_why_and_leads_back(page: Page, operator):
    sign_in(page, "olivia")
    response = page.goto("/dashboard/")
    assert response is not None and response.status == 403
    expect(page.locator("h1")).to_have_text("Not allowed")
    expect(page.locator("main")).to_contain_text("The dashboard is for supervisors of a provider.")
    assert page.locator(".bar").evaluate("e => getComputedStyle(e).borderBottomStyle") == "solid"
    screenshots_everywhere(page, "forbidden")
    page.get_by_role("link", name="Back to the queue").click()
    expect(page.locator("h1")).to_have_text("Queue")
