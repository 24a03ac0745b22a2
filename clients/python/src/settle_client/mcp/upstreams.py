"""The gateway's MCP clients: one ``mcp.Client`` per upstream, kept open for the gateway's
life (opened again if the upstream goes away)."""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskStatus
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from settle_client.mcp.config import ADDED_KEY, Config, GatedTool, Upstream

logger = logging.getLogger("settle_client.mcp")
REOPEN_SECONDS = 1.0  # between tries to open a gone upstream again
REOPEN_WAIT_SECONDS = 10.0  # a call waits this long for its upstream to be open


def _client(upstream: Upstream) -> Client:
    if upstream.command:
        params = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env=upstream.env or None,
            cwd=upstream.cwd,
        )
        return Client(params, mode="legacy")
    http = httpx2.AsyncClient(
        headers=upstream.headers or None,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=_KeptConnections(),
    )
    return Client(streamable_http_client(upstream.url, http_client=http), mode="legacy")


# An HTTP upstream's connection serves the calls after it. The SDK's client closes each
# call's event stream as soon as the result arrived, often a moment before the server
# ends it, which costs a new connection (a TCP handshake, the server's setup) for the
# next call (modelcontextprotocol/python-sdk#2707; its pull request #2712 drains the
# stream in the SDK itself: once released, this transport is no longer needed).
DRAIN_SECONDS = 0.05  # a closed stream's rest read for at most so long, else dropped
DRAIN_BYTES = 64 * 1024
# Kept idle under the servers' own bound (uvicorn's 5 s, gunicorn's 2 s), so that a call
# is not sent on a connection its server is closing.
KEEP_ALIVE_SECONDS = 1.0
# The pool's bounds otherwise httpx's own defaults, as the SDK's client has them.
LIMITS = httpx2.Limits(
    max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEP_ALIVE_SECONDS
)


class _Drained(httpx2.AsyncByteStream):
    """A response body that, closed before its end, first reads what is left of it (for
    ``DRAIN_SECONDS`` and ``DRAIN_BYTES`` at most) so its connection can be used again."""

    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self._stream = stream
        self._parts: AsyncIterator[bytes] | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._parts = self._stream.__aiter__()
        async for part in self._parts:
            yield part

    async def aclose(self) -> None:
        try:
            if self._parts is not None:
                left = DRAIN_BYTES
                with anyio.move_on_after(DRAIN_SECONDS):
                    async for part in self._parts:
                        left -= len(part)
                        if left < 0:
                            break
        finally:
            await self._stream.aclose()


class _KeptConnections(httpx2.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__(limits=LIMITS)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Drained(response.stream),
            extensions=response.extensions,
        )


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


class UpstreamLost(Exception):
    """The upstream's process or session is gone; it is being opened again."""


def _lost(exc: BaseException) -> bool:
    """Whether a call failed because the upstream itself is gone (its process exited, its
    session ended), not because it answered with an error."""
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream):
        return True
    if isinstance(exc, MCPError):
        return exc.error.code == types.CONNECTION_CLOSED or "Session terminated" in str(exc)
    return False


def _closed(client: Client) -> bool:
    """Whether the client's context ended by itself (its transport failed)."""
    try:
        client.session  # noqa: B018 -- raises once the client is closed
    except RuntimeError:
        return True
    return False


class Upstreams:
    """Every upstream's client and tools; which upstream serves which tool name.

    Each client lives in a task of its own (its transport's tasks must end in the task
    that began them): when a call finds the upstream gone (a stdio process that died, an
    HTTP server that restarted and forgot the session), that call fails, and the task
    opens the upstream again (a new process, a new session) for the calls after it,
    waiting ``REOPEN_SECONDS`` between tries.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clients: dict[str, Client] = {}
        self.tools: dict[str, types.Tool] = {}  # as listed by the upstream
        self.owner: dict[str, str] = {}  # tool name -> upstream name
        self.open: dict[str, anyio.Event] = {}  # set while the upstream's client is open
        self.gone: dict[str, anyio.Event] = {}  # set by the call that found it gone
        self.group = anyio.create_task_group()

    async def __aenter__(self) -> Upstreams:
        await self.group.__aenter__()
        try:
            for name, upstream in self.config.upstreams.items():
                await self.group.start(self._keep, name, upstream)
            await self.refresh()
        except BaseException:
            self.group.cancel_scope.cancel()
            await self.group.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.group.cancel_scope.cancel()
        await self.group.__aexit__(None, None, None)

    async def _keep(self, name: str, upstream: Upstream, *, task_status: TaskStatus[None]) -> None:
        """Keep upstream ``name``'s client open; open it again whenever it is gone."""
        started = False
        self.open[name] = anyio.Event()
        while True:
            self.gone[name] = anyio.Event()
            try:
                async with _client(upstream) as client:
                    self.clients[name] = client
                    if started:
                        await self._listed(name)
                    self.open[name].set()
                    if not started:
                        started = True
                        task_status.started()
                    await self.gone[name].wait()
            except Exception as exc:
                # Its transport may fail by itself (a stdio process that exited ends the
                # client): the calls then find it closed.
                if not started:
                    raise  # the gateway does not start without its upstreams
                logger.warning("upstream %r: %s; opening it again", name, exc)
            else:
                logger.warning("upstream %r is gone; opening it again", name)
            self.open[name] = anyio.Event()  # the calls from now wait for the next client
            await anyio.sleep(REOPEN_SECONDS)

    async def refresh(self) -> None:
        tools: dict[str, types.Tool] = {}
        owner: dict[str, str] = {}
        for name in self.clients:
            for tool in await self._tools_of(name):
                if tool.name in owner:
                    raise RuntimeError(
                        f"upstreams {owner[tool.name]!r} and {name!r} both offer a tool "
                        f"named {tool.name!r}"
                    )
                tools[tool.name], owner[tool.name] = tool, name
        self.tools, self.owner = tools, owner

    async def _tools_of(self, name: str) -> list[types.Tool]:
        client, listed, cursor = self.clients[name], [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return listed

    async def _listed(self, name: str) -> None:
        """An upstream opened again: its tools as it lists them now (the others' kept)."""
        for tool in await self._tools_of(name):
            if self.owner.get(tool.name, name) == name:
                self.tools[tool.name], self.owner[tool.name] = tool, name

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
        """The upstream's answer; ``UpstreamLost`` if the upstream is gone (the call's
        effect unknown: it may have run before it went)."""
        upstream = self.owner[name]
        with anyio.move_on_after(REOPEN_WAIT_SECONDS):
            await self.open[upstream].wait()
        if not self.open[upstream].is_set():
            raise UpstreamLost(f"the upstream {upstream!r} is not open; it is being opened again")
        client = self.clients[upstream]
        try:
            return await client.call_tool(
                name,
                arguments,
                progress_callback=progress,
                meta=meta,  # type: ignore[arg-type]
            )
        except Exception as exc:
            if not (_lost(exc) or _closed(client)):
                raise
            self.gone[upstream].set()
            raise UpstreamLost(
                f"the upstream {upstream!r} went away during the call; it is being opened again"
            ) from exc
