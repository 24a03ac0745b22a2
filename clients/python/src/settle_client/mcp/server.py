"""The gateway as an MCP server (the SDK's low-level ``Server``): every upstream's tools,
gated ones through Settle (``gate.Gate``), the rest passed through unchanged."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from settle_client.async_host import AsyncHost
from settle_client.mcp.config import Config
from settle_client.mcp.gate import Gate, tool_error
from settle_client.mcp.upstreams import UpstreamLost, Upstreams

VERSION = "0.1.0"


@dataclass
class Gateway:
    config: Config
    upstreams: Upstreams
    gate: Gate


def build(config: Config) -> Server[Gateway]:
    token = config.token()

    @asynccontextmanager
    async def lifespan(_: Server[Gateway]) -> AsyncIterator[Gateway]:
        worker = f"settle-mcp@{socket.gethostname()}:{os.getpid()}"
        async with (
            Upstreams(config) as upstreams,
            AsyncHost(config.settle_url, token, worker=worker, poll_interval=0.5) as host,
        ):
            yield Gateway(config, upstreams, Gate(config, upstreams, host))

    async def list_tools(
        ctx: ServerRequestContext[Gateway], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=ctx.lifespan_context.upstreams.listed())

    async def call_tool(
        ctx: ServerRequestContext[Gateway], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        gateway = ctx.lifespan_context
        arguments = dict(params.arguments or {})
        if params.name not in gateway.upstreams.owner:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        gated = gateway.config.gated.get(params.name)
        if gated is not None:
            return await gateway.gate.call(gated, arguments, ctx)

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        # Passthrough: the upstream's result, or its error, as it answered.
        try:
            return await gateway.upstreams.call(params.name, arguments, progress=progress)
        except UpstreamLost as exc:
            return tool_error(
                f"{params.name}: {exc}. Whether this call ran is not known; call again "
                "in a moment if that is safe."
            )

    return Server(
        "settle-mcp",
        version=VERSION,
        instructions="Tools behind Settle: gated tools run once, after approval.",
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(config: Config) -> None:
    from mcp.server.stdio import stdio_server

    server = build(config)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(config: Config, host: str, port: int, *, ready: Any = None) -> None:
    """Streamable HTTP at ``http://HOST:PORT/mcp``; prints ``ready`` once listening."""
    import uvicorn

    app = build(config).streamable_http_app(host=host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.02)
        print("ready", flush=True)
