"""The operation page in a real browser: what differs, the keyboard, a lookup finishing live."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Permit
from harness.providers import sqlite_provider_commit
from recovery.models import LookupAttempt, Operation
from recovery.services.lookup_tasks import lookup_attempt_run
from tests.support.browser import screenshot, screenshots_everywhere, sign_in
from tests.support.console import aged, queue_lookup
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db(transaction=True)


def _versions(page: Page) -> set[str]:
    return {v.get_attribute("value") or "" for v in page.locator("#actions [name=version]").all()}


@pytest.fixture
def queue(stuck):
    aged(stuck.unknown("pay-2026-000117"), minutes=95)
    aged(stuck.mismatch("pay-2026-000121"), minutes=48)
    aged(stuck.unknown("refund-2026-000007-with-a-rather-long-key"), minutes=12)


def test_an_operator_sees_the_differing_parameter_highlighted(page: Page, operator, queue):
    sign_in(page, "olivia")
    page.goto("/operations/pay-2026-000121/")
    for column in ("intended-title", "evidence-title"):
        card = page.locator(f"section:has(#{column})")
        flagged = card.locator("tr.differs")
        expect(flagged).to_have_count(1)
        expect(flagged.locator("th")).to_have_text("amount")
        expect(flagged.locator(".differs-label")).to_be_visible()
        # Marked by more than colour: the value is underlined and the row has an edge.
        decoration = flagged.locator("code").first.evaluate(
            "e => getComputedStyle(e).textDecorationLine"
        )
        assert "underline" in decoration
    differences = page.locator("section:has(#differences-title) tbody tr")
    expect(differences).to_have_count(1)
    expect(differences.first).to_contain_text("1250")
    expect(differences.first).to_contain_text("9")
    timeline = page.locator("section:has(#timeline-title) li.line")
    expect(timeline.first).to_contain_text("unknown → reconcile (escalate): mismatch")
    assert timeline.first.locator("time").get_attribute("title").endswith(" UTC")
    screenshots_everywhere(page, "operation-mismatch")


def test_the_queue_filters_by_reason_and_age_and_the_keyboard_works_everywhere(
    page: Page, operator, queue
):
    sign_in(page, "olivia")
    page.select_option("select[name=reason]", "mismatch")
    expect(page).to_have_url(re.compile(r"reason=mismatch"))
    rows = page.locator("[data-queue] tbody tr")
    expect(rows).to_have_count(1)
    page.select_option("select[name=reason]", "")
    expect(rows).to_have_count(3)
    page.select_option("select[name=age]", "hour")
    expect(page).to_have_url(re.compile(r"age=hour"))
    expect(rows).to_have_count(2)  # waiting 48 and 12 minutes
    page.select_option("select[name=age]", "day")
    expect(page).to_have_url(re.compile(r"age=day"))
    expect(rows).to_have_count(1)  # waiting 95 minutes
    expect(rows.first).to_contain_text("pay-2026-000117")
    page.select_option("select[name=age]", "")
    expect(rows).to_have_count(3)
    screenshots_everywhere(page, "queue-filters")

    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    page.keyboard.press("j")
    expect(page.locator("[data-queue] tbody tr:focus-within")).to_contain_text("pay-2026-000121")
    expect(page.get_by_role("link", name="pay-2026-000121")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/operations/pay-2026-000121/$"))
    # ? shows the sheet on the operation page too; / goes back to the queue's search.
    page.keyboard.press("?")
    expect(page.locator("#shortcuts")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#shortcuts")).to_be_hidden()
    page.keyboard.press("/")
    expect(page).to_have_url(re.compile(r"/#search$"))
    expect(page.locator("#id_q")).to_be_focused()
    # An exact permit id, entered, opens its operation.
    permit = Permit.objects.get(operation_key="pay-2026-000117")
    page.keyboard.type(str(permit.id))
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/operations/pay-2026-000117/$"))


def test_a_lookup_in_flight_finishes_on_the_page_without_a_reload(
    page: Page, operator, queue, provider_db
):
    attempt = queue_lookup(Operation.objects.get(key="pay-2026-000117"))
    sign_in(page, "olivia")
    page.goto("/operations/pay-2026-000117/")
    page.evaluate("window.notReloaded = true")
    expect(page.locator(".notice.inflight")).to_contain_text("A lookup is queued")
    expect(page.locator("#op-state .badge").first).to_have_text("unknown")
    screenshot(page, "operation-lookup-in-flight-light-1280")
    # The page is polling: wait for one poll, then the background worker's lookup runs.
    with page.expect_response(lambda r: r.request.headers.get("hx-target") == "live"):
        pass
    sqlite_provider_commit(
        provider_db, operation_key="pay-2026-000117", params=PARAMS, reference="r-117"
    )
    assert lookup_attempt_run(attempt_id=attempt.pk).state == "released"
    expect(page.locator("#op-state .badge").first).to_have_text("released")
    expect(page.locator("#live .notice.success")).to_have_text(
        "The lookup finished: the operation is released."
    )
    expect(page.locator(".notice.inflight")).to_have_count(0)
    assert page.evaluate("window.notReloaded") is True
    # The action forms now carry the version the operator sees.
    version = Operation.objects.get(key="pay-2026-000117").version
    assert _versions(page) == {str(version)}
    # And the polling stopped.
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if r.headers.get("hx-target") else None)
    page.wait_for_timeout(2500)
    assert polls == []
    screenshots_everywhere(page, "operation-looked-up-live")


@pytest.mark.parametrize("moves", ["moveBefore", "replaceChild"])
def test_what_the_operator_is_typing_survives_a_lookup_finishing(
    page: Page, operator, queue, moves
):
    if moves == "replaceChild":
        # Browsers without Element.moveBefore (Firefox, Safari today): htmx moves the kept
        # input with replaceChild, which takes the focus away from it.
        page.add_init_script("delete Element.prototype.moveBefore")
    sign_in(page, "olivia")
    page.goto("/operations/pay-2026-000121/")
    page.fill("#id_reason_lookup", "the customer says the amount was corrected")
    page.get_by_role("button", name="Look up now").click()
    expect(page.locator(".notice.inflight")).to_contain_text("A lookup is queued")
    attempt = LookupAttempt.objects.get(operation__key="pay-2026-000121", trigger="operator")
    # While it runs, the operator starts on two reasons, and is typing the second.
    page.fill("#id_reason_void", "ordered twice")
    page.click("#id_reason_confirm")
    page.keyboard.type("the provider's amount is a typo, the customer")
    # Mark the panel as drawn: a redraw replaces the element, and the mark with it.
    page.evaluate("document.getElementById('actions').dataset.drawn = 'first'")
    with page.expect_response(lambda r: r.request.headers.get("hx-target") == "live"):
        pass
    # A real lookup, by the background worker's code: the provider still holds amount 9.
    assert lookup_attempt_run(attempt_id=attempt.pk).looked_up
    expect(page.locator("#live .notice.success")).to_have_text(
        "The lookup finished: the operation is reconcile."
    )
    expect(page.locator("#actions[data-drawn]")).to_have_count(0)  # the panel was redrawn
    assert _versions(page) == {str(Operation.objects.get(key="pay-2026-000121").version)}
    # What was typed is still there, and the operator types on where they were.
    expect(page.locator("#id_reason_void")).to_have_value("ordered twice")
    expect(page.locator("#id_reason_confirm")).to_be_focused()
    page.keyboard.type(" agrees")
    expect(page.locator("#id_reason_confirm")).to_have_value(
        "the provider's amount is a typo, the customer agrees"
    )
    if moves == "moveBefore":
        screenshots_everywhere(page, "operation-typed-reasons-kept")
