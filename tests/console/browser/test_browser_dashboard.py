"""The supervisor dashboard in a real browser: charts, their tables, the provider filter."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from common.actors import Actor
from console.models import DashboardRollup
from console.services.dashboard import dashboard_refresh, settle_bucket
from recovery.services.roles import role_grant
from tests.support.browser import screenshots_everywhere, sign_in
from tests.support.console import aged, console_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def boss(provider, other_provider):
    """Supervises both providers."""
    user = console_user("bella", "supervisor", provider)
    role_grant(user=user, role="supervisor", provider=other_provider, actor=Actor.system("t"))
    return user


def _a_day_of_traffic(provider) -> None:
    """Rollup rows for the hours before the test's own, as the refresh would count them."""
    now = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    rows = []
    for back in range(1, 24):
        hour = now - timedelta(hours=back)
        for verdict, n in (
            ("match", 20 + back % 7 * 3),
            ("absent", back % 5),
            ("mismatch", back % 3),
        ):
            if n:
                rows.append(
                    DashboardRollup(figure="lookup", hour=hour, provider=provider, key=verdict, n=n)
                )
        rows.append(
            DashboardRollup(
                figure="settle",
                hour=hour,
                provider=provider,
                key=str(settle_bucket(40 + back * 30)),
                n=3,
            )
        )
    for day in range(1, 14):
        hour = now - timedelta(days=day)
        for action, n in (("confirm", day % 4 + 1), ("void", day % 3), ("lookup", 5 - day % 5)):
            if n:
                rows.append(
                    DashboardRollup(
                        figure="operator", hour=hour, provider=provider, key=action, n=n
                    )
                )
    DashboardRollup.objects.bulk_create(rows)


@pytest.fixture
def board(stuck, other_stuck, provider, other_provider):
    aged(stuck.unknown("pay-2026-000117"), minutes=60 * 30)
    aged(stuck.mismatch("pay-2026-000121"), minutes=48)
    aged(stuck.unknown("refund-2026-000007-with-a-rather-long-key"), minutes=12)
    stuck.released("pay-2026-000130")
    aged(other_stuck.unknown("ledger-000042"), minutes=30)
    _a_day_of_traffic(provider)
    dashboard_refresh(now=timezone.now() + timedelta(minutes=5))


def test_a_supervisor_reads_the_dashboard_and_filters_it(page: Page, boss, board):
    sign_in(page, "bella")
    page.click("nav >> text=Dashboard")
    expect(page).to_have_url(re.compile(r"/dashboard/$"))
    stuck = page.locator("[data-stuck] table").first
    expect(stuck.locator("tbody tr")).to_have_count(2)
    expect(stuck.locator("tfoot")).to_contain_text("3")  # unknown, both providers
    expect(page.locator("[data-oldest]")).to_contain_text("pay-2026-000117")
    expect(page.locator("svg[role=img]")).to_have_count(5)
    # Each chart is an image named by its title, for a screen reader too.
    for name in (
        "Stuck now, by reason",
        "Queue by time waiting",
        "Lookups per hour by verdict, last 24 hours (UTC)",
        "Lost lease to settled, last 7 days",
        "Operator actions per day, last 14 days (UTC)",
    ):
        expect(page.get_by_role("img", name=re.compile("^" + re.escape(name)))).to_be_visible()
    expect(page.locator("#chart-reasons")).to_contain_text("Evidence mismatch")
    screenshots_everywhere(page, "dashboard")

    page.evaluate("window.notReloaded = true")
    page.select_option("#id_provider", "ledger")
    expect(page).to_have_url(re.compile(r"provider=ledger"))
    expect(stuck.locator("tbody tr")).to_have_count(1)
    expect(stuck.locator("tbody")).to_contain_text("ledger")
    assert page.evaluate("window.notReloaded") is True  # htmx swapped the figures only
    assert "pay-2026-000117" not in page.locator("#figures").inner_text()

    # A bar of the reasons chart opens the queue filtered to it.
    page.locator("#chart-reasons a").first.click()
    expect(page).to_have_url(re.compile(r"/\?provider=ledger&reason=lease_lost$"))
    expect(page.locator("[data-queue] tbody tr")).to_have_count(1)


def test_an_operator_finds_no_dashboard(page: Page, operator, board):
    sign_in(page, "olivia")
    expect(page.get_by_role("navigation", name="Main")).not_to_contain_text("Dashboard")
    response = page.goto("/dashboard/")
    assert response is not None and response.status == 403
