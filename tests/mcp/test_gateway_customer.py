"""A gated call the customer approves on their phone: the agent's client is sent the
customer's link (URL-mode elicitation), Chromium opens it and taps Approve, and the call
goes on and runs once."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from django.core.management import call_command
from mcp import Client
from playwright.sync_api import Page, expect

from approvals.models import Approval
from tests.support.browser import PHONE, browser, page, screenshot
from tests.support.mcp import in_thread

__all__ = ["browser", "page"]  # Chromium's fixtures, on the gateway tests' live server

pytestmark = [
    pytest.mark.processes,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

# Notes go to a customer, who alone decides; the gateway names them by the note's "to".
CUSTOMER_POLICY = """
[[rules]]
name = "notes-the-customer-approves"
provider = "payments"
action = "note.send"
outcome = "customer"
reason = "a note is sent only if its addressee agrees"

[[actions]]
provider = "payments"
action = "note.send"
summary = "Send you the note: {/text}"
"""


def test_the_customer_approves_a_gated_call_by_their_link_in_chromium(
    mcp_setup, http_process, page: Page, settings, tmp_path: Path
):
    settings.SETTLE_CUSTOMER_URL = mcp_setup.url
    policy = tmp_path / "customer-policy.toml"
    policy.write_text(CUSTOMER_POLICY)
    call_command("policy", "apply", str(policy), "--yes", verbosity=0)
    upstream = http_process(
        ["-m", "harness.mcp_upstream", "--journal", str(mcp_setup.journal), "http", "--port",
         "{port}"]
    )  # fmt: skip
    config = mcp_setup.config(http_upstream=upstream, extra='party_argument = "to"\n')
    url = http_process(
        ["-m", "settle_client.mcp.cli", "serve", str(config), "--http", "127.0.0.1:{port}"],
        env=mcp_setup.gateway_env(),
    )
    asked: queue.Queue[str] = queue.Queue()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert params.mode == "url"
        asked.put(params.url)
        return types.ElicitResult(action="accept")

    note = {"to": "ada", "text": "Your parcel is at the door.", "settle_key": "note-1"}

    async def scenario() -> Any:
        async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
            return await client.call_tool("send_note", note)

    thread, outcome = in_thread(scenario)
    link = asked.get(timeout=60)
    approval = Approval.objects.get(operation_key="note-1")
    assert approval.customer == "customer" and approval.party.party == "ada"
    assert link.startswith(f"{mcp_setup.url}/approve/#")  # the customer's, not the console's
    assert mcp_setup.effects() == []  # nothing runs before the customer decides

    page.set_viewport_size(PHONE)
    page.goto(link)
    expect(page.locator("[data-stage]")).to_be_visible()
    expect(page.locator(".customer-summary")).to_have_text(
        "Send you the note: Your parcel is at the door."
    )
    page.get_by_role("button", name="Approve").click()
    expect(page.locator('[data-outcome="approved"]')).to_be_visible()
    screenshot(page, "customer-approves-gateway-call-390")

    thread.join(timeout=60)
    assert "error" not in outcome, outcome
    result = outcome["value"]
    assert not result.is_error, result.content
    assert result.structured_content == {"note_id": "note-note-1", "to": "ada"}
    assert [key for key, _ in mcp_setup.effects()] == ["note-1"]
