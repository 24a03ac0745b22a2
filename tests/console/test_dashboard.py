"""The supervisor dashboard: who may see it, what of which provider, and its figures.

Decided: the dashboard is for supervisors. A user who supervises no provider (a viewer
or an operator only) gets 403 and no link to it; a supervisor sees only the providers
they supervise, never another's, even one they operate.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from common.actors import Actor
from console.services.dashboard import dashboard_refresh
from recovery.services.roles import role_grant
from tests.support.console import aged, client_for, console_user

pytestmark = pytest.mark.django_db


def _board(user: User | None, query: str = "", **headers: str):
    return client_for(user).get(f"/dashboard/{query}", **headers)


def _refreshed() -> None:
    """Beat's refresh, run as if the rollup's margin had passed."""
    dashboard_refresh(now=timezone.now() + timedelta(minutes=5))


def test_anonymous_is_sent_to_sign_in():
    response = _board(None)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/dashboard/")


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_a_viewer_or_operator_is_refused_and_offered_no_link(provider, stuck, role):
    stuck.unknown("op-1")
    user = console_user(f"{role}-1", role, provider)
    assert _board(user).status_code == 403
    queue = client_for(user).get("/").content.decode()
    assert 'href="/dashboard/"' not in queue


def test_a_supervisor_sees_stuck_counts_reasons_and_the_oldest(supervisor, stuck):
    old = aged(stuck.unknown("op-old"), minutes=60 * 30)
    stuck.unknown("op-new")
    aged(stuck.mismatch("op-mismatch"), minutes=5)
    stuck.released("op-done")
    _refreshed()
    response = _board(supervisor)
    assert response.status_code == 200
    board = response.context["board"]
    [row] = board.stuck
    # Every dead worker's receipt is still running: three stranded receipts.
    assert (row.provider, row.unknown, row.reconcile, row.stranded) == ("orders", 2, 1, 3)
    assert board.reasons["lease_lost"] == 2
    assert board.reasons["mismatch"] == 1
    assert board.reasons["stranded"] == 3
    assert board.ages == {"hour": 2, "day": 0, "week": 1, "older": 0}
    assert board.oldest.key == old.key
    page = response.content.decode()
    assert 'href="/dashboard/" aria-current="page"' in page
    assert 'href="/operations/op-old/"' in page
    # Each chart is an image with its title, and its numbers are in a table.
    assert page.count('role="img"') == 5
    assert '<title id="chart-reasons-title">Stuck now, by reason</title>' in page
    assert '<th scope="row">Worker&#x27;s lease lapsed</th><td class="num">2</td>' in page


def test_another_providers_data_is_never_shown(supervisor, provider, stuck, other_stuck):
    """The supervisor of orders also operates ledger: ledger is not on the dashboard."""
    ledger = other_stuck.unknown("ledger-1")
    other_stuck.mismatch("ledger-2")
    role_grant(
        user=supervisor, role="operator", provider=ledger.provider, actor=Actor.system("test")
    )
    stuck.unknown("op-1")
    _refreshed()
    response = _board(supervisor)
    board = response.context["board"]
    assert [p.name for p in board.providers] == ["orders"]
    assert [(row.provider, row.unknown, row.reconcile) for row in board.stuck] == [("orders", 1, 0)]
    assert board.reasons["mismatch"] == 0
    assert sum(sum(hour.values()) for hour in board.lookups.values()) == 1
    page = response.content.decode()
    assert "ledger" not in page
    # Asked for by name, it is ignored, with the same words as for no such provider.
    for name in ("ledger", "no-such-provider"):
        asked = _board(supervisor, f"?provider={name}")
        assert asked.status_code == 200
        assert "Ignored provider" in asked.content.decode()
        assert "ledger-" not in asked.content.decode()
        assert [p.name for p in asked.context["board"].providers] == ["orders"]


def test_a_supervisor_of_two_filters_to_one(provider, other_provider, stuck, other_stuck):
    boss = console_user("boss", "supervisor", provider)
    role_grant(user=boss, role="supervisor", provider=other_provider, actor=Actor.system("t"))
    stuck.unknown("op-1")
    other_stuck.unknown("ledger-1")
    other_stuck.unknown("ledger-2")
    _refreshed()
    both = _board(boss).context["board"]
    assert [(row.provider, row.unknown) for row in both.stuck] == [("ledger", 2), ("orders", 1)]
    one = _board(boss, "?provider=ledger").context["board"]
    assert [(row.provider, row.unknown) for row in one.stuck] == [("ledger", 2)]
    # htmx gets the figures alone, not the page around them.
    swapped = _board(boss, "?provider=ledger", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in swapped
    assert swapped.lstrip().startswith('<div id="figures"')
    assert "?provider=ledger&amp;state=unknown" in swapped
    assert "provider=orders" not in swapped


def test_the_rolled_up_figures_and_when_they_were_refreshed(supervisor, stuck, operator):
    stuck.released("op-1")
    stuck.mismatch("op-2")
    page = _board(supervisor).content.decode()
    assert "Nothing counted yet" in page
    _refreshed()
    response = _board(supervisor)
    board = response.context["board"]
    this_hour = board.lookup_hours[-1]
    assert board.lookups[this_hour]["match"] == 1
    assert board.lookups[this_hour]["mismatch"] == 1
    assert board.settle["day"].count == 1
    assert board.settle["day"].median is not None
    assert board.settle["day"].median < 60
    assert dict(board.settle_bars)["under 1 min"] == 1
    assert "What is stuck: as of" in response.content.decode()


def test_a_superuser_sees_every_provider(provider, other_provider):
    root = User.objects.create_superuser("root", password="x")
    board = _board(root).context["board"]
    assert {p.name for p in board.providers} == {"orders", "ledger"}


def test_the_page_says_its_figures_trail_the_log_and_by_how_much(supervisor, stuck):
    """A fresh install's charts are empty for the first minutes although lookups ran: the
    page says why (the rollup counts up to a margin behind now), not just nothing."""
    stuck.unknown("op-1")
    _refreshed()
    page = _board(supervisor).content.decode()
    assert "counted 2 minutes behind" in page
    assert "what ran since shows then" in page
