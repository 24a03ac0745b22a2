"""A Streamable HTTP MCP server (the official SDK's) with one evidence tool, for the adapter tests.

``python -m tests.support.mcp_evidence PORT ANSWERS.json [TOKEN]``: the tool ``evidence``
answers an operation key with what ``ANSWERS.json`` (read at each call) holds for it:
``{"structured": {...}}`` as structured content, ``{"text": "..."}`` as one text content,
``{"error": "..."}`` as a tool error, ``{"sleep": s}`` after ``s`` seconds; a key it does
not hold is answered ``{"operation_key": key, "found": false}``. With ``TOKEN``, a request
without ``Authorization: Bearer TOKEN`` is refused with 401.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent


def app(answers_path: str, token: str) -> Any:
    server = MCPServer("evidence")

    @server.tool()
    def evidence(operation_key: str) -> CallToolResult:
        """The record of the effect done under ``operation_key``, if any."""
        with open(answers_path) as file:
            answer = json.load(file).get(operation_key)
        if answer is None:
            absent = {"operation_key": operation_key, "found": False}
            return CallToolResult(content=[TextContent(type="text", text=json.dumps(absent))])
        if "sleep" in answer:
            time.sleep(answer["sleep"])
        if "error" in answer:
            return CallToolResult(
                content=[TextContent(type="text", text=answer["error"])], is_error=True
            )
        if "structured" in answer:
            text = TextContent(type="text", text=json.dumps(answer["structured"]))
            return CallToolResult(content=[text], structured_content=answer["structured"])
        return CallToolResult(content=[TextContent(type="text", text=answer["text"])])

    inner = server.streamable_http_app(json_response=True)

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode()
        if scope["type"] == "http" and token and given != f"Bearer {token}":
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await inner(scope, receive, send)

    return guarded


def main() -> None:
    port, answers_path = int(sys.argv[1]), sys.argv[2]
    token = sys.argv[3] if len(sys.argv) > 3 else ""
    config = uvicorn.Config(
        app(answers_path, token), host="127.0.0.1", port=port, log_level="warning"
    )
    anyio.run(uvicorn.Server(config).serve)


if __name__ == "__main__":
    main()
