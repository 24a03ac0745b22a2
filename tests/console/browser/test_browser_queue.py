"""The queue in a real browser: sign in, see it, filter it, move through it by keyboard."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from harness.providers import sqlite_provider_commit
from tests.support.browser import (
    NARROW,
    WIDE,
    assert_no_overflow,
    screenshot,
    screenshots_everywhere,
    sign_in,
)
from tests.support.console import aged
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(stuck, other_stuck):
    aged(stuck.unknown("pay-2026-000117"), minutes=95)
    aged(stuck.mismatch("pay-2026-000121"), minutes=48)
    aged(stuck.unknown("refund-2026-000007-with-a-rather-long-key"), minutes=12)
    aged(other_stuck.unknown("ledger-000042"), minutes=30)


def rows(page: Page):
    return page.locator("[data-queue] tbody tr")


def highlighted(page: Page) -> list[int]:
    """The rows drawn as selected (the accent edge on their left)."""
    return page.eval_on_selector_all(
        "[data-queue] tbody tr",
        "rows => rows.flatMap((r, i) => getComputedStyle(r).boxShadow === 'none' ? [] : [i])",
    )


def test_an_operator_signs_in_and_sees_the_queue(page: Page, operator, queue):
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    screenshot(page, "sign-in")
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": NARROW, "height": 800})
    assert_no_overflow(page)
    screenshot(page, "sign-in-dark-390")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": WIDE, "height": 800})
    sign_in(page, "olivia")
    expect(rows(page)).to_have_count(3)
    expect(rows(page).nth(0)).to_contain_text("pay-2026-000117")
    expect(rows(page).nth(1)).to_contain_text("Evidence mismatch")
    assert "ledger-000042" not in page.content()
    title = rows(page).nth(0).locator("time").first.get_attribute("title")
    assert title and title.endswith(" UTC")
    screenshots_everywhere(page, "queue")


def test_filters_update_the_results_and_the_url_without_a_reload(page: Page, operator, queue):
    sign_in(page, "olivia")
    page.evaluate("window.notReloaded = true")
    page.select_option("select[name=state]", "reconcile")
    expect(page).to_have_url(re.compile(r"state=reconcile"))
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first).to_contain_text("pay-2026-000121")
    page.select_option("select[name=state]", "")
    page.fill("#id_q", "refund")
    expect(rows(page)).to_have_count(1)
    expect(rows(page).first).to_contain_text("refund-2026-000007")
    assert page.evaluate("window.notReloaded") is True  # htmx swapped the results only
    # The filtered view is a link: opening it afresh shows the same.
    page.goto(page.url)
    expect(rows(page)).to_have_count(1)
    expect(page.locator("#id_q")).to_have_value("refund")


def test_the_keyboard_moves_through_the_queue_and_opens_an_operation(page: Page, operator, queue):
    sign_in(page, "olivia")
    page.keyboard.press("?")
    expect(page.locator("#shortcuts")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#shortcuts")).to_be_hidden()
    page.keyboard.press("/")
    expect(page.locator("#id_q")).to_be_focused()
    page.keyboard.press("j")  # typing in the search box is typing, not moving
    expect(page.locator("#id_q")).to_have_value("j")
    expect(rows(page)).to_have_count(0)  # no key starts with "j"
    page.keyboard.press("Backspace")
    expect(rows(page)).to_have_count(3)
    page.locator("#id_q").blur()
    links = rows(page).locator("a.key")
    page.keyboard.press("j")  # the focus itself moves, to the row's link
    expect(links.nth(0)).to_be_focused()
    assert highlighted(page) == [0]
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")  # stays on the last
    expect(links.nth(2)).to_be_focused()
    assert highlighted(page) == [2]
    page.keyboard.press("k")
    expect(links.nth(1)).to_be_focused()
    assert highlighted(page) == [1]
    # The highlight is the focus, however it moved: Tab back, and j goes on from there.
    page.keyboard.press("Shift+Tab")  # first to the row's own selection box
    expect(rows(page).nth(1).locator(".pick input")).to_be_focused()
    assert highlighted(page) == [1]
    page.keyboard.press("Shift+Tab")
    expect(links.nth(0)).to_be_focused()
    assert highlighted(page) == [0]
    page.keyboard.press("j")
    expect(links.nth(1)).to_be_focused()
    expect(page.locator("[aria-selected]")).to_have_count(0)  # not a listbox: no such state
    screenshot(page, "queue-keyboard-focus-light-1280")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/operations/pay-2026-000121/$"))
    expect(page.locator("h1")).to_have_text("pay-2026-000121")
    screenshots_everywhere(page, "operation")


def test_a_viewer_of_one_provider_never_sees_anothers_operation(page: Page, viewer, queue):
    sign_in(page, "victor")
    expect(rows(page)).to_have_count(3)
    assert "ledger-000042" not in page.content()
    page.select_option("select[name=state]", "unknown")
    expect(rows(page)).to_have_count(2)
    assert "ledger-000042" not in page.content()
    response = page.goto("/operations/ledger-000042/")
    assert response is not None and response.status == 404
    expect(page.locator("h1")).to_have_text("Not found")


def test_an_operator_looks_up_now_and_watches_a_background_worker_settle_it(
    page: Page, operator, queue, provider_db, celery_env, celery_procs, settings
):
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_env["SETTLE_CELERY_QUEUE"]
    sqlite_provider_commit(
        provider_db, operation_key="pay-2026-000117", params=PARAMS, reference="r-117"
    )
    sign_in(page, "olivia")
    page.goto("/operations/pay-2026-000117/")
    expect(page.locator(".page-head .badge").first).to_have_text("unknown")
    page.fill("#id_reason_lookup", "the provider says it went through")
    page.click("text=Look up now")
    expect(page.locator(".notice.success")).to_contain_text("Queued: a background worker")
    # The worker starts once the page shows the lookup queued, so that the page is drawn
    # while it is in flight (a worker already running could finish it first).
    expect(page.locator("#live .notice.inflight")).to_contain_text("A lookup is queued")
    celery_procs("worker", celery_env).wait_for_log("ready.", timeout=60)
    # The page polls while the lookup is in flight: no reload.
    expect(page.locator(".page-head .badge").first).to_have_text("released", timeout=30_000)
    # The view reads the lookup in flight before the operation, so the poll that shows
    # the badge released may still show the lookup running; a later poll says it
    # finished, which on a loaded machine can be some seconds on.
    expect(page.locator("#live .notice.success")).to_contain_text(
        "The lookup finished", timeout=30_000
    )
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.set_viewport_size({"width": WIDE, "height": 800})
        assert_no_overflow(page)
        screenshot(page, f"operation-looked-up-{scheme}-{WIDE}")


def test_a_viewer_sees_no_action_on_an_operation(page: Page, viewer, queue):
    sign_in(page, "victor")
    page.goto("/operations/pay-2026-000117/")
    expect(page.locator("h1")).to_have_text("pay-2026-000117")
    expect(page.locator("text=Look up now")).to_have_count(0)


def test_a_long_provider_name_stays_on_one_line_in_the_wide_queue(page: Page, operator, queue):
    from recovery.models import Provider

    Provider.objects.filter(name="orders").update(name="demo-payments-eu-west")
    sign_in(page, "olivia")
    cell = rows(page).nth(0).locator('td[data-label="Provider"]')
    expect(cell).to_have_text("demo-payments-eu-west")
    lines = cell.evaluate(
        "td => { const r = document.createRange(); r.selectNodeContents(td);"
        " return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; }"
    )
    assert lines == 1
