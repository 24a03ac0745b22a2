"""settle-mcp over Streamable HTTP (both sides: the agent's and the upstream's), driven
by the MCP Python SDK's client: a person's approval through URL-mode elicitation, and
fifty concurrent calls against a policy budget."""

from __future__ import annotations

import queue
import time
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from approvals.models import Approval
from recovery.models import Dispatch, Operation
from tests.support.mcp import http_gateway as start_gateway
from tests.support.mcp import in_thread

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PAYMENT = {"idempotency_key": "pay-1", "payee": "bob", "amount": 40, "currency": "EUR"}


def test_a_staff_approval_through_url_elicitation_continues_the_call(
    mcp_setup, http_process, signed_in_staff
):
    url = start_gateway(mcp_setup, http_process)
    large = {**PAYMENT, "idempotency_key": "pay-big", "amount": 5000}
    asked: queue.Queue[str] = queue.Queue()
    progress: list[str | None] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert params.mode == "url"
        asked.put(params.url)
        return types.ElicitResult(action="accept")

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async def scenario() -> Any:
        async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
            return await client.call_tool("send_payment", large, progress_callback=on_progress)

    thread, outcome = in_thread(scenario)
    page = asked.get(timeout=60)
    approval = Approval.objects.get(operation_key="pay-big")
    assert page == f"{mcp_setup.url}/approvals/{approval.pk}/"
    assert mcp_setup.effects() == []
    signed_in_staff.approve(approval)
    thread.join(timeout=60)
    assert "error" not in outcome, outcome
    result = outcome["value"]
    assert not result.is_error, result.content
    assert result.structured_content["payment_id"] == "pay-pay-big"
    assert "waiting for approval" in progress
    assert len(mcp_setup.effects("pay-big")) == 1
    assert Operation.objects.get(key="pay-big").state == "released"


def test_a_staff_denial_through_url_elicitation_is_a_tool_error(
    mcp_setup, http_process, signed_in_staff
):
    url = start_gateway(mcp_setup, http_process)
    large = {**PAYMENT, "idempotency_key": "pay-no", "amount": 5000}
    asked: queue.Queue[str] = queue.Queue()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.put(params.url)
        return types.ElicitResult(action="accept")

    async def scenario() -> Any:
        async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
            return await client.call_tool("send_payment", large)

    thread, outcome = in_thread(scenario)
    asked.get(timeout=60)
    signed_in_staff.decide(Approval.objects.get(operation_key="pay-no"), "deny", "too much")
    thread.join(timeout=60)
    result = outcome["value"]
    assert result.is_error and "denied" in result.content[0].text
    assert mcp_setup.effects() == []
    assert not Dispatch.objects.exists()


def test_fifty_concurrent_calls_never_pass_the_policy_budget(mcp_setup, http_process):
    url = start_gateway(mcp_setup, http_process)  # the budget: 1000 EUR, 40 EUR a call

    async def scenario() -> list[Any]:
        results: list[Any] = [None] * 50
        async with Client(url, mode="legacy", read_timeout_seconds=120) as client:

            async def one(index: int) -> None:
                call = {**PAYMENT, "idempotency_key": f"pay-{index}"}
                results[index] = await client.call_tool("send_payment", call)

            async with anyio.create_task_group() as group:
                for index in range(50):
                    group.start_soon(one, index)
        return results

    results = anyio.run(scenario)
    done = [r for r in results if not r.is_error]
    waiting = [r for r in results if r.is_error]
    assert len(done) == 25, [r.content[0].text for r in waiting][:3]
    assert all("waits for approval" in r.content[0].text for r in waiting)
    assert len(mcp_setup.effects()) == 25
    assert Operation.objects.filter(state="released").count() == 25
    assert Operation.objects.filter(state="awaiting_approval").count() == 25


def test_a_client_cancelling_the_wait_leaves_the_operation_waiting_with_nothing_dispatched(
    mcp_setup, http_process, signed_in_staff
):
    url = start_gateway(mcp_setup, http_process)
    large = {**PAYMENT, "idempotency_key": "pay-cancel", "amount": 5000}

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        return types.ElicitResult(action="accept")

    async def cancelled() -> None:
        async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "send_payment", large)
                await asked.wait()
                await anyio.sleep(0.5)
                group.cancel_scope.cancel()
            await anyio.sleep(0.5)  # the cancellation reaches the gateway

    asked = anyio.Event()
    thread, outcome = in_thread(cancelled)
    thread.join(timeout=60)
    assert "error" not in outcome, outcome
    assert Operation.objects.get(key="pay-cancel").state == "awaiting_approval"
    signed_in_staff.approve(Approval.objects.get(operation_key="pay-cancel"))
    time.sleep(3)  # a wait that went on would dispatch within a second of the decision
    assert not Dispatch.objects.exists()
    assert mcp_setup.effects() == []

    async def again() -> Any:
        async with Client(url, mode="legacy") as client:
            return await client.call_tool("send_payment", large)

    result = anyio.run(again)
    assert result.structured_content["payment_id"] == "pay-pay-cancel"
    assert len(mcp_setup.effects("pay-cancel")) == 1


def test_a_wait_past_its_bound_says_the_action_still_waits_and_nothing_ran(mcp_setup, http_process):
    upstream = http_process(
        [
            "-m",
            "harness.mcp_upstream",
            "--journal",
            str(mcp_setup.journal),
            "http",
            "--port",
            "{port}",
        ]
    )
    config = mcp_setup.config(http_upstream=upstream, wait=1.5)
    url = http_process(
        ["-m", "settle_client.mcp.cli", "serve", str(config), "--http", "127.0.0.1:{port}"],
        env=mcp_setup.gateway_env(),
    )

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async def scenario() -> Any:
        async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
            return await client.call_tool(
                "send_payment", {**PAYMENT, "idempotency_key": "pay-slow", "amount": 5000}
            )

    result = anyio.run(scenario)
    assert result.is_error
    assert "still awaiting approval" in result.content[0].text
    assert "after 1.5 s" in result.content[0].text and "pay-slow" in result.content[0].text
    assert Operation.objects.get(key="pay-slow").state == "awaiting_approval"
    assert mcp_setup.effects() == []


def test_an_upstream_dying_after_its_commit_is_left_to_evidence_not_reported(
    mcp_setup, http_process
):
    upstream = http_process(
        [
            "-m",
            "harness.mcp_upstream",
            "--journal",
            str(mcp_setup.journal),
            "http",
            "--port",
            "{port}",
        ],
        env={"MCP_UPSTREAM_DIE_AFTER_COMMIT": "pay-dies"},
    )
    url = http_process(
        ["-m", "settle_client.mcp.cli", "serve", str(mcp_setup.config(http_upstream=upstream)),
         "--http", "127.0.0.1:{port}"],
        env=mcp_setup.gateway_env(),
    )  # fmt: skip

    async def scenario() -> Any:
        async with Client(url, mode="legacy", read_timeout_seconds=60) as client:
            return await client.call_tool(
                "send_payment", {**PAYMENT, "idempotency_key": "pay-dies"}
            )

    result = anyio.run(scenario)
    assert result.is_error and "not known yet" in result.content[0].text
    assert "same key" in result.content[0].text
    assert len(mcp_setup.effects("pay-dies")) == 1  # committed before it died
    operation = Operation.objects.get(key="pay-dies")
    assert operation.state == "dispatched"  # no report: the lease lapses, evidence decides
    assert Dispatch.objects.get(operation=operation).receipt_status == "running"
