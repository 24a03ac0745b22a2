"""The status page in a real browser: green, then red once beat stops sweeping (htmx
refreshes the checks without a reload); screenshots light and dark."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from recovery.models import Pulse
from recovery.services.runs import pulse_record
from tests.support.browser import screenshots_everywhere, sign_in
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_status_page_is_green_then_red_when_beat_stops(page: Page, provider, settings):
    settings.SETTLE_LIVENESS_BEAT_SECONDS = 60
    console_user("vera", "viewer", provider)
    pulse_record(name=Pulse.Name.SWEEP, seconds=0.12)
    sign_in(page, "vera")
    page.click("nav >> text=Status")
    summary = page.locator(".status-summary")
    expect(summary).to_have_text("All checks green.")
    expect(page.locator('[data-check="beat"]')).to_have_attribute("data-ok", "true")
    screenshots_everywhere(page, "status-green")

    pulse_record(name=Pulse.Name.SWEEP, seconds=0.12, at=timezone.now() - timedelta(minutes=5))
    # htmx asks for the checks every 10 s; no reload.
    expect(summary).to_have_text("Something needs attention.", timeout=15_000)
    beat = page.locator('[data-check="beat"]')
    expect(beat).to_have_attribute("data-ok", "false")
    expect(beat).to_contain_text("last sweep 5 min ago")
    screenshots_everywhere(page, "status-red")
