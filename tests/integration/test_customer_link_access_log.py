"""A full customer decision through gunicorn, in Chromium: the link's token is in no line
of the access log (nor any Referer it records) and in nothing gunicorn wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import Browser, expect

from approvals.models import Approval
from common.links import approval_link_token
from harness.gunicorn import database_url, gunicorn_running
from recovery.models import Operation
from tests.support.browser import PHONE, browser
from tests.support.customers import customer_open, customer_policy_apply

__all__ = ["browser"]

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

# Every request line, its status, the Referer and the User-Agent.
ACCESS_FORMAT = '%(h)s "%(r)s" %(s)s "%(f)s" "%(a)s" %(U)s?%(q)s'


def test_the_token_never_reaches_the_access_log(browser: Browser, flow, tmp_path: Path):
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    customer_policy_apply()
    opened = customer_open(flow)
    token = approval_link_token(opened["approval_id"])
    access = tmp_path / "access.log"
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=1,
        env={
            "GUNICORN_CMD_ARGS": f"--access-logfile {access} --access-logformat '{ACCESS_FORMAT}'"
        },
    ) as server:
        context = browser.new_context(base_url=server.url, viewport=PHONE)
        try:
            page = context.new_page()
            page.goto(f"/approve/#{token}")
            page.get_by_role("button", name="Approve").click()
            expect(page.locator('[data-outcome="approved"]')).to_be_visible()
        finally:
            context.close()
        log = access.read_text()
        written = (tmp_path / "gunicorn.log").read_text()
    assert Approval.objects.get(pk=opened["approval_id"]).status == "approved"
    assert Operation.objects.get(key="op-1").state == "approved"
    assert "POST /approve/decide" in log and "GET /approve/" in log, log
    assert token not in log and token[:20] not in log
    assert token not in written
