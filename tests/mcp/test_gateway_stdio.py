"""settle-mcp over stdio, driven by the MCP Python SDK's client: ungated tools pass
through unchanged, a gated call runs once and its repeat answers the first result."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest
from settle_client.canonical import params_digest

from approvals.models import Approval
from recovery.models import Dispatch, Operation
from tests.support.mcp import stdio_gateway as gateway

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

PAYMENT = {"idempotency_key": "pay-1", "payee": "bob", "amount": 40, "currency": "EUR"}


def test_ungated_tools_pass_through_with_their_schemas_errors_and_progress(mcp_setup):
    async def scenario() -> None:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {
                "send_payment",
                "send_note",
                "lookup_effect",
                "get_balance",
                "count_slowly",
            }
            assert tools["get_balance"].input_schema["required"] == ["account"]
            assert "settle_key" not in tools["send_payment"].input_schema["properties"]
            note = tools["send_note"].input_schema
            assert "settle_key" in note["properties"] and "settle_key" in note["required"]
            balance = await client.call_tool("get_balance", {"account": "acct-1"})
            assert balance.structured_content == {"account": "acct-1", "balance": 1000}
            missing = await client.call_tool("get_balance", {"account": "nobody"})
            assert missing.is_error and "no account 'nobody'" in missing.content[0].text
            seen: list[float] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                seen.append(value)

            counted = await client.call_tool(
                "count_slowly", {"n": 3, "delay": 0.01}, progress_callback=progress
            )
            assert counted.content[0].text == "counted to 3"
            assert seen == [1, 2, 3]

    anyio.run(scenario)
    assert Operation.objects.count() == 0


def test_a_gated_call_runs_once_and_its_repeat_answers_the_first_result(mcp_setup):
    async def scenario() -> tuple[Any, Any, Any]:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            first = await client.call_tool("send_payment", PAYMENT)
            again = await client.call_tool("send_payment", PAYMENT)
            other = await client.call_tool("send_payment", {**PAYMENT, "amount": 41})
            return first, again, other

    first, again, other = anyio.run(scenario)
    assert not first.is_error, first.content
    assert first.structured_content == {"payment_id": "pay-pay-1", "payee": "bob", "amount": 40}
    assert again.structured_content == first.structured_content
    assert again.content == first.content
    assert other.is_error and "already used for a different action" in other.content[0].text
    params = {k: v for k, v in PAYMENT.items() if k != "idempotency_key"}
    assert mcp_setup.effects() == [("pay-1", params_digest(params))]
    operation = Operation.objects.get(key="pay-1")
    assert (operation.state, operation.params_digest) == ("released", params_digest(params))
    receipt = Dispatch.objects.get(operation=operation)
    assert receipt.receipt_result["tool_result"]["structuredContent"] == first.structured_content


def test_a_committed_call_whose_answer_settle_cannot_keep_is_still_committed(mcp_setup):
    """The upstream answers a payee of 34,000 characters twice (structured and as text):
    past what Settle keeps of a result (16 KiB) and past what any params may be (64 KiB).
    The effect ran: the call answers it, the receipt keeps its digest, never a failure."""
    big = {**PAYMENT, "idempotency_key": "pay-wide", "payee": "b" * 34_000}

    async def scenario() -> tuple[Any, Any]:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            return (
                await client.call_tool("send_payment", big),
                await client.call_tool("send_payment", big),
            )

    first, again = anyio.run(scenario)
    assert not first.is_error, first.content[0].text[:300]
    assert first.structured_content["payee"] == big["payee"]
    assert again.is_error and "already completed" in again.content[0].text
    assert "too large to keep" in again.content[0].text
    assert len(mcp_setup.effects("pay-wide")) == 1
    receipt = Dispatch.objects.get(operation__key="pay-wide")
    assert (receipt.operation.state, receipt.receipt_status) == ("released", "succeeded")
    assert receipt.receipt_result == {
        "tool_result_digest": receipt.receipt_reference,
        "truncated": True,
    }
    assert receipt.receipt_reference.startswith("sha256:")


def test_a_gateway_restarted_between_calls_answers_from_settle_not_its_memory(mcp_setup):
    config = mcp_setup.config()

    async def once() -> Any:
        async with gateway(mcp_setup, config) as client:
            return await client.call_tool("send_payment", PAYMENT)

    first = anyio.run(once)
    second = anyio.run(once)
    assert second.structured_content == first.structured_content
    assert len(mcp_setup.effects("pay-1")) == 1


def test_the_added_key_is_required_and_never_reaches_the_upstream(mcp_setup):
    async def scenario() -> tuple[Any, Any]:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            keyless = await client.call_tool("send_note", {"to": "ann", "text": "hi"})
            sent = await client.call_tool(
                "send_note", {"to": "ann", "text": "hi", "settle_key": "note-1"}
            )
            return keyless, sent

    keyless, sent = anyio.run(scenario)
    assert keyless.is_error and "'settle_key' is required" in keyless.content[0].text
    assert sent.structured_content == {"note_id": "note-note-1", "to": "ann"}
    assert mcp_setup.effects() == [("note-1", params_digest({"to": "ann", "text": "hi"}))]
    assert Operation.objects.get(key="note-1").params == {"to": "ann", "text": "hi"}


def test_a_policy_denial_is_a_tool_error_and_nothing_runs(mcp_setup):
    async def scenario() -> Any:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            return await client.call_tool(
                "send_note", {"to": "mallory", "text": "x", "settle_key": "note-m"}
            )

    denied = anyio.run(scenario)
    assert denied.is_error
    assert "denied" in denied.content[0].text and "not run" in denied.content[0].text
    assert mcp_setup.effects() == []
    assert Operation.objects.get(key="note-m").state == "denied"


def test_without_elicitation_a_call_awaiting_a_person_says_where_and_continues_later(
    mcp_setup, signed_in_staff
):
    large = {**PAYMENT, "idempotency_key": "pay-big", "amount": 5000}
    config = mcp_setup.config()

    async def call() -> Any:
        async with gateway(mcp_setup, config) as client:
            return await client.call_tool("send_payment", large)

    waiting = anyio.run(call)
    approval = Approval.objects.get(operation_key="pay-big")
    text = waiting.content[0].text
    assert waiting.is_error and "waits for approval" in text
    assert f"{mcp_setup.url}/approvals/{approval.pk}/" in text and "pay-big" in text
    assert mcp_setup.effects() == []
    signed_in_staff.approve(approval)
    done = anyio.run(call)
    assert done.structured_content["payment_id"] == "pay-pay-big"
    assert len(mcp_setup.effects("pay-big")) == 1


def _upstream_pids(journal: Any) -> list[int]:
    """The test upstream's processes (``harness.mcp_upstream`` on this journal)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    words = cmdline.read().split(b"\0")
            except OSError:
                continue
            if b"harness.mcp_upstream" in words and str(journal).encode() in words:
                found.append(int(entry))
    return found


def test_an_upstream_process_that_dies_is_started_again(mcp_setup):
    """SIGKILLed under a running gateway: the next call is told it is gone, the calls
    after it reach a new process, and a gated call runs once there."""

    async def scenario() -> tuple[Any, Any, Any]:
        async with gateway(mcp_setup, mcp_setup.config()) as client:
            before = await client.call_tool("get_balance", {"account": "acct-1"})
            assert not before.is_error
            (first,) = _upstream_pids(mcp_setup.journal)
            os.kill(first, signal.SIGKILL)
            told = await client.call_tool("get_balance", {"account": "acct-1"})
            with anyio.fail_after(30):
                while True:
                    again = await client.call_tool("get_balance", {"account": "acct-1"})
                    if not again.is_error:
                        break
                    await anyio.sleep(0.2)
            assert _upstream_pids(mcp_setup.journal) not in ([], [first])
            paid = await client.call_tool("send_payment", PAYMENT)
            return told, again, paid

    told, again, paid = anyio.run(scenario)
    assert told.is_error and "went away" in told.content[0].text
    assert again.structured_content == {"account": "acct-1", "balance": 1000}
    assert not paid.is_error and paid.structured_content["payment_id"] == "pay-pay-1"
    assert [key for key, _ in mcp_setup.effects()] == ["pay-1"]
