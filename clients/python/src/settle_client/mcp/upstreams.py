"""The gateway's MCP clients: one ``mcp.Client`` per upstream, open for the gateway's life."""

from __future__ import annotations

import copy
from contextlib import AsyncExitStack
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import ProgressFnT

from settle_client.mcp.config import ADDED_KEY, Config, GatedTool, Upstream


def _client(upstream: Upstream) -> Client:
    if upstream.command:
        params = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env=upstream.env or None,
            cwd=upstream.cwd,
        )
        return Client(params, mode="legacy")
    http = create_mcp_http_client(headers=upstream.headers or None)
    return Client(streamable_http_client(upstream.url, http_client=http), mode="legacy")


def gated_schema(tool: types.Tool, gate: GatedTool) -> types.Tool:
    """The tool as the agent sees it: with ``key = "added"``, a required ``settle_key``."""
    if not gate.key_added:
        return tool
    schema = copy.deepcopy(dict(tool.input_schema))
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})[ADDED_KEY] = {
        "type": "string",
        "minLength": 1,
        "maxLength": 200,
        "description": "Names this action: the same key for a retry of the same call "
        "(it then runs at most once), a new key for a new action.",
    }
    schema["required"] = [*schema.get("required", []), ADDED_KEY]
    return tool.model_copy(update={"input_schema": schema})


class Upstreams:
    """Every upstream's client and tools; which upstream serves which tool name."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clients: dict[str, Client] = {}
        self.tools: dict[str, types.Tool] = {}  # as listed by the upstream
        self.owner: dict[str, str] = {}  # tool name -> upstream name
        self.stack = AsyncExitStack()

    async def __aenter__(self) -> Upstreams:
        await self.stack.__aenter__()
        try:
            for name, upstream in self.config.upstreams.items():
                self.clients[name] = await self.stack.enter_async_context(_client(upstream))
            await self.refresh()
        except BaseException:
            await self.stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stack.aclose()

    async def refresh(self) -> None:
        tools: dict[str, types.Tool] = {}
        owner: dict[str, str] = {}
        for name, client in self.clients.items():
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                for tool in page.tools:
                    if tool.name in owner:
                        raise RuntimeError(
                            f"upstreams {owner[tool.name]!r} and {name!r} both offer a tool "
                            f"named {tool.name!r}"
                        )
                    tools[tool.name], owner[tool.name] = tool, name
                cursor = page.next_cursor
                if not cursor:
                    break
        self.tools, self.owner = tools, owner

    def listed(self) -> list[types.Tool]:
        """The tools the agent sees: every upstream's, a gated one with its added key."""
        gated = self.config.gated
        return [gated_schema(t, gated[n]) if n in gated else t for n, t in self.tools.items()]

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        progress: ProgressFnT | None = None,
        meta: dict[str, Any] | None = None,
    ) -> types.CallToolResult:
        client = self.clients[self.owner[name]]
        return await client.call_tool(
            name,
            arguments,
            progress_callback=progress,
            meta=meta,  # type: ignore[arg-type]
        )
