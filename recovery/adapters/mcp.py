"""The MCP adapter: an evidence tool on a Streamable HTTP MCP server, asked by operation key.

The provider's secret describes the server (``mcp_server_parse``), all of it write-only,
because a hosted MCP server's URL often carries its credential::

    {"url": "https://tools.example/mcp", "tool": "evidence",
     "bearer": "…"}                      # or "headers": {"Authorization": "…"}

The official MCP SDK opens a session (``initialize``), calls ``tool`` with
``{"operation_key": KEY}`` and closes it. The tool answers with one JSON object, as its
``structuredContent`` or else as its only text content::

    {"operation_key": KEY, "found": false}
    {"operation_key": KEY, "found": true, "params_digest": "…",
     "status": "committed" | "failed", "reference": "…"}   # both optional

A record without ``status`` is of an effect done (``committed``); without ``reference`` it
has none. Other fields (the effect's result, a count) are kept with the evidence as read.

A provider configured with no secret has no evidence tool (an upstream over stdio, or one
without such a tool): every lookup is ``unavailable``, so its uncertain operations go to an
operator once the lookup budget is spent, as any provider's without evidence do.

The verdicts are ``base``'s: a record for another key, a ``found`` that is not a boolean,
a record ``record_problem`` refuses or an answer of any other shape is ``corrupt``; the
server unreachable, the session or the call failing, the tool reporting an error
(``isError``, an unknown tool included) is ``unavailable``. The whole exchange ends at
the provider's ``timeout_seconds``; more than ``MAX_RECORD_BYTES`` read (and a margin for
the protocol's own messages) is ``corrupt``, as an HTTP provider's oversize answer is. The
address check of ``common.outbound`` applies unless private addresses are allowed
(``SETTLE_MCP_ALLOW_PRIVATE``).
"""

from __future__ import annotations

import functools
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from common.canonical import CanonicalError, strict_loads
from common.outbound import OutboundGuard, outbound_async_client
from recovery.adapters.base import (
    ABSENT,
    MAX_RECORD_BYTES,
    LookupResult,
    ProviderConfig,
    corrupt,
    digest_verdict,
    record_problem,
    snippet,
    unavailable,
    verdict_result,
)

# What the protocol's own messages (initialize, headers, SSE framing) may add to a record.
PROTOCOL_MARGIN = 64 * 1024
_SECRET_KEYS = frozenset({"url", "tool", "bearer", "headers"})
_TOOL_DEFAULT = "evidence"


@dataclass(frozen=True)
class McpServer:
    """Where and how to ask: parsed from the provider's write-only secret."""

    url: str
    tool: str = _TOOL_DEFAULT
    headers: dict[str, str] = field(default_factory=dict)


def mcp_server_parse(secret: str) -> McpServer:
    """The server a secret describes; ``ValueError`` saying what is wrong, never the secret."""
    try:
        data = strict_loads(secret)
    except CanonicalError:
        raise ValueError("the mcp secret must be a JSON object") from None
    if not isinstance(data, dict):
        raise ValueError("the mcp secret must be a JSON object")
    unknown = sorted(set(data) - _SECRET_KEYS)
    if unknown:
        raise ValueError(
            f"the mcp secret has unknown keys {unknown}; it takes {sorted(_SECRET_KEYS)}"
        )
    url = data.get("url")
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError("the mcp secret's url must be http:// or https:// with a host")
    tool = data.get("tool", _TOOL_DEFAULT)
    if not isinstance(tool, str) or not tool:
        raise ValueError("the mcp secret's tool must be a tool's name")
    headers = data.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(key, str) and key.isascii() and key.strip() and isinstance(value, str)
        for key, value in headers.items()
    ):
        raise ValueError("the mcp secret's headers must map header names to text")
    bearer = data.get("bearer")
    if bearer is not None:
        if not isinstance(bearer, str) or not bearer:
            raise ValueError("the mcp secret's bearer must be a token")
        headers = {**headers, "Authorization": f"Bearer {bearer}"}
    return McpServer(url=str(url), tool=tool, headers=dict(headers))


@functools.cache
def _trusted() -> ssl.SSLContext:
    """The system's certificates, as for an HTTP provider (``http._trusted``)."""
    return ssl.create_default_context()


def mcp_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    """One MCP session: ``initialize``, call the evidence tool for ``operation_key``, close."""
    if not config.secret:
        return unavailable(
            "This provider has no evidence tool (no MCP server is configured): an operator "
            "decides once the lookup budget is spent.",
            error="no_evidence_tool",
        )
    try:
        server = mcp_server_parse(config.secret)
    except ValueError as exc:
        return unavailable(
            f"The provider's MCP server is misconfigured: {exc}.", error="bad_secret"
        )
    guard = OutboundGuard(
        refuse_private=not config.allow_private, byte_cap=MAX_RECORD_BYTES + PROTOCOL_MARGIN
    )
    try:
        answer = anyio.run(_call, server, operation_key, config.timeout_seconds, guard)
    except Exception as exc:  # anything the SDK, its task group or the network raised
        return _failed(exc, guard, config.timeout_seconds)
    if guard.over_cap:
        return corrupt(f"The MCP server's answer is larger than {MAX_RECORD_BYTES} bytes.", {})
    return _mcp_verdict(server.tool, operation_key, expected, answer)


async def _call(
    server: McpServer, operation_key: str, seconds: float, guard: OutboundGuard
) -> CallToolResult:
    with anyio.fail_after(seconds):
        async with (
            outbound_async_client(
                guard=guard, seconds=seconds, headers=server.headers, ssl_context=_trusted()
            ) as client,
            streamable_http_client(server.url, http_client=client, max_sse_event_size=None) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await session.call_tool(server.tool, {"operation_key": operation_key})


def _failed(exc: BaseException, guard: OutboundGuard, seconds: float) -> LookupResult:
    # The SDK wraps a transport's error in its task group's exception group.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    error = f"{type(exc).__name__}: {exc}"
    if guard.over_cap:
        return corrupt(f"The MCP server's answer is larger than {MAX_RECORD_BYTES} bytes.", {})
    if guard.refused_address:
        return unavailable(
            f"The MCP server's address {guard.refused_address} is private or reserved, and "
            "private addresses are not allowed (SETTLE_MCP_ALLOW_PRIVATE); nothing was sent.",
            error="address_refused",
            address=guard.refused_address,
        )
    if guard.error_status:
        return unavailable(
            f"The MCP server answered HTTP {guard.error_status} ({error}).",
            error=f"http_{guard.error_status}",
            status=guard.error_status,
        )
    if isinstance(exc, TimeoutError):
        return unavailable(
            f"The MCP server did not answer within {seconds} seconds.", error="timeout"
        )
    return unavailable(f"The MCP server could not be asked ({error}).", error=error)


def _answer_object(result: CallToolResult) -> tuple[Any, str]:
    """The tool's answer as JSON, and the text it came as."""
    if result.structured_content is not None:
        return result.structured_content, str(result.structured_content)
    texts = [item.text for item in result.content if isinstance(item, TextContent)]
    if len(texts) != 1 or len(result.content) != 1:
        raise ValueError("carries neither structured content nor exactly one text content")
    try:
        return strict_loads(texts[0]), texts[0]
    except CanonicalError as exc:
        raise ValueError(f"is not valid JSON ({exc.message})") from None


def _mcp_verdict(
    tool: str, operation_key: str, expected: str, result: CallToolResult
) -> LookupResult:
    what = f"MCP evidence tool {tool!r}"
    if result.is_error:
        text = " ".join(item.text for item in result.content if isinstance(item, TextContent))
        return unavailable(
            f"The {what} reported an error: {snippet(text)}", error="tool_error", text=snippet(text)
        )
    try:
        record, text = _answer_object(result)
    except ValueError as exc:
        return corrupt(f"The {what}'s answer {exc}.", {"content": snippet(str(result.content))})
    if not isinstance(record, dict):
        return corrupt(f"The {what}'s answer is not a JSON object.", {"text": snippet(text)})
    raw: dict[str, Any] = {"record": record}
    if record.get("operation_key") != operation_key:
        return corrupt(
            f"The {what} answered about operation key {record.get('operation_key')!r}, "
            "not the one asked for.",
            raw,
        )
    found = record.get("found")
    if not isinstance(found, bool):
        return corrupt(f"The {what}'s answer has no boolean 'found'.", raw)
    if not found:
        return verdict_result(ABSENT, f"The {what} has no record for this key.", raw)
    # A record is of an effect done: "committed" unless it says otherwise; no reference
    # unless it gives one. Whatever it does say is judged as every adapter judges it.
    record = {"status": "committed", "reference": "", **record}
    problem = record_problem(record, f"{what}'s record")
    if problem is not None:
        return corrupt(problem, raw)
    return digest_verdict(record, expected, raw, f"{what}'s record")
