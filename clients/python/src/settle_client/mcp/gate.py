"""A gated tool call: one Settle operation, dispatched once, its result kept by Settle.

The key rule (docs/mcp-gateway.md): the operation key is the key argument's value; the
params are the call's arguments *without* the key argument, so the same action has the
same digest whatever key names it, and the key never counts as part of the action.

The gateway keeps nothing of its own: a repeat of the call (after a crash of the agent,
the gateway, or the upstream) goes through the client library's lifecycle, which
registers idempotently and resumes, never dispatching twice; a finished call's result
comes back from the receipt (``receipt.result``) Settle kept with the first report.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

from settle_client import errors
from settle_client._protocol import decision_read, held_whole
from settle_client.async_host import AsyncHost
from settle_client.canonical import CanonicalError, canonical_params
from settle_client.mcp.config import Config, GatedTool
from settle_client.mcp.upstreams import Upstreams

META_KEY = "io.settle/operation_key"
META_TOKEN = "io.settle/fencing_token"
MAX_RESULT_BYTES = 16 * 1024  # the receipt's cap (the server's common.canonical)
POLL_SECONDS = 1.0
WAIT_SECONDS = 5  # each read held for the decision at most so long: progress between


def tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


KEPT_PREFIX = b'{"tool_result":'


def _kept(result: types.CallToolResult) -> tuple[dict[str, Any], str]:
    """The result as the receipt keeps it (whole where Settle takes it, else its digest
    only) and the digest of the whole: the report's reference.

    The effect ran whatever the answer is like: an answer no params could be (over
    64 KiB, nested deeper than 10) is digested as its sorted JSON text instead, never an
    error that would report a committed effect as failed."""
    whole = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    kept: dict[str, Any] = {"tool_result": whole}
    try:
        text = canonical_params(kept)
    except CanonicalError:
        plain = json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = "sha256:" + hashlib.sha256(plain.encode("utf-8", "surrogatepass")).hexdigest()
        return {"tool_result_digest": digest, "truncated": True}, digest
    # The canonical text of a one-key object is the key, then its value's canonical text:
    # the whole's digest is params_digest(whole) without writing it out a second time.
    digest = "sha256:" + hashlib.sha256(text[len(KEPT_PREFIX) : -1]).hexdigest()
    if len(text) > MAX_RESULT_BYTES:
        return {"tool_result_digest": digest, "truncated": True}, digest
    return kept, digest


def _told_by_evidence(record: dict[str, Any]) -> types.CallToolResult | None:
    """The result the upstream's evidence tool gave with the record that confirmed the
    effect (its ``result``: the tool's structured result, or ``tool_result``: the whole
    answer), for a call whose first answer was lost; None if it gave none."""
    for evidence in reversed(record.get("evidence") or []):
        # The mcp adapter keeps the evidence tool's answer as ``raw["record"]``.
        kept = evidence.get("raw")
        raw = kept.get("record") if isinstance(kept, dict) else None
        if evidence.get("verdict") != "match" or not isinstance(raw, dict):
            continue
        try:
            if isinstance(raw.get("tool_result"), dict):
                return types.CallToolResult.model_validate(raw["tool_result"])
            if isinstance(raw.get("result"), dict):
                text = types.TextContent(type="text", text=json.dumps(raw["result"]))
                return types.CallToolResult(content=[text], structured_content=raw["result"])
        except ValidationError:
            return None
        return None
    return None


def _from_receipt(
    tool: str, record: dict[str, Any], listed: types.Tool | None = None
) -> types.CallToolResult:
    """A repeat of a finished call: what its first call answered, or what the upstream's
    evidence said it answered. Else words saying it ran; for a tool with an output
    schema, as an error result (whose words say not to run it again), since an answer
    without its structured content is refused by the agent's client."""
    receipt = record.get("receipt") or {}
    kept = receipt.get("result") or {}
    if record.get("state") == "failed":
        return tool_error(
            f"{tool}: the earlier call with this key failed and will not be run again. "
            "To try again, call it with a new key."
        )
    if "tool_result" in kept:
        return types.CallToolResult.model_validate(kept["tool_result"])
    told = _told_by_evidence(record) if receipt.get("recovered") else None
    if told is not None:
        return told
    how = (
        "confirmed from the provider's own record"
        if receipt.get("recovered")
        else "its result was too large to keep"
    )
    reference = receipt.get("provider_reference") or ""
    return types.CallToolResult(
        content=[
            types.TextContent(
                type="text",
                text=f"{tool}: this action already completed ({how}); it was not run again "
                "and must not be: do not call it with a new key."
                + (f" Reference: {reference}." if reference else ""),
            )
        ],
        is_error=listed is not None and listed.output_schema is not None,
    )


def _refused(tool: str, exc: errors.SettleError) -> types.CallToolResult:
    """Settle's refusals and closed operations, in words a model can act on."""
    code = getattr(exc, "code", "")
    if isinstance(exc, errors.ApprovalDenied):
        text = "the approver denied this action; it was not run. Do not retry it as is."
    elif isinstance(exc, errors.ApprovalExpired):
        text = (
            "the approval expired before anyone decided; it was not run. Call again with "
            "a new key to ask again."
        )
    elif isinstance(exc, errors.OperationRevoked | errors.OperationVoided):
        text = f"this action was {exc.state}; it was not run and will not be."
    elif isinstance(exc, errors.NeedsOperator):
        text = (
            "the outcome of this action is not known yet; Settle is confirming it with the "
            "provider (or an operator will). Do not call it with a new key: call again "
            "later with the same key to learn the outcome; it will not run twice."
        )
    elif code == "key_conflict":
        text = (
            "this key was already used for a different action (other arguments); it was "
            "not run. Use a new key for a new action, or the same arguments to repeat one."
        )
    else:
        text = f"Settle refused the call ({code or type(exc).__name__}): {exc}"
    return tool_error(f"{tool}: {text}")


def _elicits_url(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    return bool(
        caps
        and caps.elicitation
        and caps.elicitation.url is not None
        and ctx.session.can_send_request
    )


class _AwaitsPerson(Exception):
    """The lifecycle met an approval a person must decide: stop it there, so that the
    gate can show the page and wait, then run the lifecycle again."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(approval_id)
        self.approval_id = approval_id


def _awaits_person(approval_id: str) -> None:
    raise _AwaitsPerson(approval_id)


def _party(gate: GatedTool, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The customer the call names (its ``party_argument``): an id, or ``{id, name?,
    contact?}`` as the host API takes it; None when the tool names none."""
    if not gate.party_argument or arguments.get(gate.party_argument) is None:
        return None
    value = arguments[gate.party_argument]
    return dict(value) if isinstance(value, dict) else {"id": str(value)}


class Gate:
    def __init__(self, config: Config, upstreams: Upstreams, host: AsyncHost) -> None:
        self.config, self.upstreams, self.host = config, upstreams, host

    async def call(
        self, gate: GatedTool, arguments: dict[str, Any], ctx: ServerRequestContext[Any, Any]
    ) -> types.CallToolResult:
        key = arguments.get(gate.key_argument)
        if not isinstance(key, str) or not key:
            return tool_error(
                f"{gate.name}: the argument {gate.key_argument!r} is required: a key naming "
                "this action (the same key to retry it, a new one for a new action)."
            )
        params = {k: v for k, v in arguments.items() if k != gate.key_argument}
        forwarded = params if gate.key_added else arguments
        try:
            canonical_params(params)
        except CanonicalError as exc:
            return tool_error(f"{gate.name}: these arguments cannot be approved: {exc}")
        party = _party(gate, arguments)
        try:
            # The first request registers, opens the approval and, where a policy approves
            # it as it opens, dispatches: a policy-approved call is that and the report.
            try:
                return await self._execute(
                    gate, key, params, forwarded, party, on_approval=_awaits_person
                )
            except _AwaitsPerson as awaiting:
                waiting = await self._approval(gate, key, awaiting.approval_id, ctx)
            if waiting is not None:
                return waiting
            return await self._execute(gate, key, params, forwarded, party)
        except errors.SettleError as exc:
            return _refused(gate.name, exc)

    async def _approval(
        self, gate: GatedTool, key: str, approval_id: str, ctx: ServerRequestContext[Any, Any]
    ) -> types.CallToolResult | None:
        """Wait for a person's decision where the client can show the page. ``None``: go
        on (decided); else the answer to give."""
        # Addressed to the customer, the approval carries the link to give them.
        link = (await self.host.approval(approval_id)).get("link") or ""
        who = "the customer" if link else "an approver"
        link = link or f"{self.config.console_url}/approvals/{approval_id}/"
        if not _elicits_url(ctx):
            return tool_error(
                f"{gate.name}: not done yet: this action waits for approval by {who} at "
                f"{link} . Nothing was run. Once it is approved, call {gate.name} again with "
                f"the same arguments and the same key ({key}) to continue; it will run once."
            )
        elicitation = str(uuid.uuid4())
        message = f"{gate.name} needs approval by {who} before it runs ({gate.action})."

        async def ask() -> None:
            # The user's answer (accept, decline) does not decide anything: the approval
            # does, wherever it is made. A client that fails the request changes nothing.
            with contextlib.suppress(Exception):
                await ctx.session.elicit_url(message, link, elicitation, ctx.request_id)

        with anyio.move_on_after(self.config.approval_wait_seconds) as waited:
            async with anyio.create_task_group() as group:
                group.start_soon(ask)
                await self._decided(key, ctx)
                group.cancel_scope.cancel()  # the client's answer no longer matters
        if waited.cancelled_caught:
            return tool_error(
                f"{gate.name}: still awaiting approval at {link} after "
                f"{self.config.approval_wait_seconds:g} s; nothing was run. Call again with "
                f"the same key ({key}) to keep waiting."
            )
        with contextlib.suppress(Exception):
            await ctx.session.send_elicit_complete(elicitation, ctx.request_id)
        return None

    async def _decided(self, key: str, ctx: ServerRequestContext[Any, Any]) -> str:
        """Wait until the operation leaves ``awaiting_approval``: reads Settle holds until
        the decision (``?wait=``), progress between them; where Settle answers at once
        (it holds no more reads), again after a second. Cancelling the request stops it,
        nothing dispatched."""
        started = time.monotonic()
        while True:
            sent = time.monotonic()
            record = await self.host.http.call(decision_read(key, WAIT_SECONDS))
            state = str(record.get("state"))
            if state != "awaiting_approval":
                return state
            elapsed = time.monotonic() - started
            await ctx.session.report_progress(elapsed, None, "waiting for approval")
            if not held_whole(sent, WAIT_SECONDS):
                await anyio.sleep(POLL_SECONDS)

    async def _execute(
        self,
        gate: GatedTool,
        key: str,
        params: dict[str, Any],
        forwarded: dict[str, Any],
        party: dict[str, Any] | None,
        on_approval: Callable[[str], object] | None = None,
    ) -> types.CallToolResult:
        answer: types.CallToolResult | None = None
        async with self.host.action(
            key,
            action=gate.action,
            provider=gate.provider,
            params=params,
            on_approval=on_approval,
            party=party,
        ) as attempt:
            if attempt.fencing_token is not None:
                meta = {META_KEY: key, META_TOKEN: attempt.fencing_token}
                try:
                    answer = await self.upstreams.call(gate.name, forwarded, meta=meta)
                except Exception:  # the answer is lost: the effect may or may not have run
                    attempt.unknown = True
                    raise errors.NeedsOperator(
                        "upstream call lost", key=key, state="dispatched", reason="unknown"
                    ) from None
                attempt.result, attempt.reference = _kept(answer)
                if answer.is_error:
                    attempt.error = RuntimeError(json.dumps(attempt.result)[:500])
        if answer is not None:
            return answer
        record = await self.host.operation(key)
        return _from_receipt(gate.name, record, self.upstreams.tools.get(gate.name))
