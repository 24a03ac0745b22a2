"""A test MCP server with an effect journal: the upstream the gateway tests put behind Settle.

Run: ``python -m harness.mcp_upstream --journal FILE stdio`` or
``python -m harness.mcp_upstream --journal FILE http --port PORT`` (Streamable HTTP on
127.0.0.1, path ``/mcp``; prints ``ready`` on stdout once listening). Written with the
official MCP Python SDK (``MCPServer``), as an upstream nobody wrote for Settle would be.

Tools:

* ``send_payment(idempotency_key, payee, amount, currency)`` -- the gated write tool
  (a key argument of its own). Every call is an effect: a row appended to the journal
  (the journal does not deduplicate, so a second dispatch shows as a second row).
* ``send_note(to, text)`` -- a gated write tool without a key argument (the gateway adds
  ``settle_key``): its operation key comes from the call's ``_meta``
  (``io.settle/operation_key``), which the gateway sends with every gated call.
* ``lookup_effect(operation_key)`` -- the evidence tool: the first record for the key
  (``found``, ``operation_key``, ``params_digest``, ``result``, ``count``), or
  ``found: false``. The params digest is the client library's (``params_digest`` of the
  tool's arguments without the key argument), as the gateway registers them.
* ``get_balance(account)`` -- an ungated read tool; an unknown account is a tool error.
* ``count_slowly(n, delay)`` -- an ungated tool that reports progress ``n`` times, for
  passthrough of progress and cancellation.

Settle's ``mcp`` adapter tests: ``--answers FILE`` (JSON, read at each call) makes
``lookup_effect`` answer a key listed there as listed instead of from the journal --
``{"structured": {...}}`` as structured content, ``{"text": "..."}`` as one text content,
``{"error": "..."}`` as a tool error, with ``"sleep": s`` first -- the answers no sound
server gives. ``--bearer TOKEN`` (http) answers 401 to a request without
``Authorization: Bearer TOKEN``.

Crash tests of the gateway: ``--sleep-before-commit SUBSTRING`` and
``--sleep-after-commit SUBSTRING`` hold a call whose operation key contains SUBSTRING
``--sleep-seconds`` (default 5) before it commits, or after it committed and before it
answers: the moments a gateway is killed at. A held call is logged (``holding KEY``, on
stderr) as its hold begins.

Crash tests: ``--die-after-commit SUBSTRING`` (or ``MCP_UPSTREAM_DIE_AFTER_COMMIT``)
makes the process ``os._exit(17)`` right after it committed the effect of a call whose
operation key contains SUBSTRING (``*``: every call), before answering.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from settle_client.canonical import params_digest

META_KEY = "io.settle/operation_key"
BALANCES = {"acct-1": 1000, "acct-2": 250}


class Journal:
    """Effects in SQLite (WAL, one connection per call): key, params digest, result."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                " operation_key TEXT NOT NULL, tool TEXT NOT NULL, params_digest TEXT NOT NULL,"
                " result TEXT NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def append(self, key: str, tool: str, digest: str, result: dict[str, Any]) -> int:
        with self.lock, self._connect() as db:
            cursor = db.execute(
                "INSERT INTO effects (operation_key, tool, params_digest, result)"
                " VALUES (?, ?, ?, ?)",
                (key, tool, digest, json.dumps(result, sort_keys=True)),
            )
            return int(cursor.lastrowid or 0)

    def records(self, key: str) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT seq, operation_key, tool, params_digest, result FROM effects"
                " WHERE operation_key = ? ORDER BY seq",
                (key,),
            ).fetchall()
        return [
            {"seq": s, "operation_key": k, "tool": t, "params_digest": d, "result": json.loads(r)}
            for s, k, t, d, r in rows
        ]


def _listed_answer(answers: Path | None, key: str) -> CallToolResult | None:
    """The answer ``--answers`` lists for ``key``, as a tool result; None if none."""
    if answers is None:
        return None
    listed = json.loads(answers.read_text() or "{}").get(key)
    if listed is None:
        return None
    time.sleep(listed.get("sleep", 0))
    if "error" in listed:
        return CallToolResult(
            content=[TextContent(type="text", text=listed["error"])], is_error=True
        )
    if "structured" in listed:
        text = TextContent(type="text", text=json.dumps(listed["structured"]))
        return CallToolResult(content=[text], structured_content=listed["structured"])
    return CallToolResult(content=[TextContent(type="text", text=listed["text"])])


def build(
    journal: Journal,
    die_after_commit: str = "",
    answers: Path | None = None,
    slow: tuple[str, str, float] = ("", "", 0.0),
) -> MCPServer:
    server = MCPServer("settle-test-upstream", version="1.0", log_level="WARNING")

    def commit(key: str, tool: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        before, after, seconds = slow
        if before and before in key:
            print(f"holding {key}", file=sys.stderr, flush=True)
            time.sleep(seconds)
        journal.append(key, tool, params_digest(params), result)
        if after and after in key:
            time.sleep(seconds)
        if die_after_commit and (die_after_commit == "*" or die_after_commit in key):
            os._exit(17)  # committed, never answered: the crash the recovery tests need

    @server.tool()
    def send_payment(
        idempotency_key: str, payee: str, amount: int, currency: str
    ) -> dict[str, Any]:
        """Send a payment (an effect). idempotency_key names the intent."""
        params = {"payee": payee, "amount": amount, "currency": currency}
        result = {"payment_id": f"pay-{idempotency_key}", "payee": payee, "amount": amount}
        commit(idempotency_key, "send_payment", params, result)
        return result

    @server.tool()
    def send_note(to: str, text: str, ctx: Context) -> dict[str, Any]:
        """Send a note to someone (an effect)."""
        meta = ctx.request_context.meta or {}
        key = str(meta.get(META_KEY) or "")
        if not key:
            raise ToolError("send_note needs _meta io.settle/operation_key")
        result = {"note_id": f"note-{key}", "to": to}
        commit(key, "send_note", {"to": to, "text": text}, result)
        return result

    @server.tool()
    # ``Any``: no output schema, so the server may answer a listed text answer as it is
    # (the record itself comes as JSON text; Settle's mcp adapter reads either form).
    def lookup_effect(operation_key: str) -> Any:
        """Evidence: what this server recorded for an operation key."""
        listed = _listed_answer(answers, operation_key)
        if listed is not None:
            return listed
        records = journal.records(operation_key)
        if not records:
            return {"found": False, "operation_key": operation_key, "count": 0}
        first = records[0]
        return {
            "found": True,
            "operation_key": first["operation_key"],
            "params_digest": first["params_digest"],
            "result": first["result"],
            "count": len(records),
        }

    @server.tool()
    def get_balance(account: str) -> dict[str, Any]:
        """Read an account's balance."""
        if account not in BALANCES:
            raise ToolError(f"no account {account!r}")
        return {"account": account, "balance": BALANCES[account]}

    @server.tool()
    async def count_slowly(n: int, delay: float, ctx: Context) -> str:
        """Count to n, reporting progress after each step."""
        import anyio

        for step in range(1, n + 1):
            await anyio.sleep(delay)
            await ctx.report_progress(step, n, f"step {step}")
        return f"counted to {n}"

    return server


def _bearer_required(app: Any, token: str) -> Any:
    """``app``, answering 401 to an HTTP request without ``Authorization: Bearer token``."""
    if not token:
        return app

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        given = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
        if scope["type"] == "http" and given != f"Bearer {token}":
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def _ending_late(app: Any, seconds: float) -> Any:
    """``app``, ending each response body ``seconds`` after its last part, as a server or
    proxy that sends a stream's end on its own does (the result event before it)."""
    if not seconds:
        return app

    async def late(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                await send({**message, "more_body": True})
                await anyio.sleep(seconds)
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await app(scope, receive, sending)

    return late


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument(
        "--die-after-commit", default=os.environ.get("MCP_UPSTREAM_DIE_AFTER_COMMIT", "")
    )
    sub = parser.add_subparsers(dest="transport", required=True)
    sub.add_parser("stdio")
    parser.add_argument("--answers", type=Path, default=None)
    parser.add_argument("--sleep-before-commit", default="")
    parser.add_argument("--sleep-after-commit", default="")
    parser.add_argument("--sleep-seconds", type=float, default=5.0)
    http = sub.add_parser("http")
    http.add_argument("--port", type=int, required=True)
    http.add_argument("--bearer", default="")
    http.add_argument("--end-late", type=float, default=0.0, help="seconds")
    args = parser.parse_args(argv)
    slow = (args.sleep_before_commit, args.sleep_after_commit, args.sleep_seconds)
    server = build(Journal(args.journal), args.die_after_commit, args.answers, slow)
    if args.transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = _bearer_required(
        server.streamable_http_app(json_response=False, stateless_http=False), args.bearer
    )
    app = _ending_late(app, args.end_late)

    async def serve() -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning")
        uv = uvicorn.Server(config)
        async with anyio.create_task_group() as group:
            group.start_soon(uv.serve)
            while not uv.started:
                await anyio.sleep(0.02)
            print("ready", flush=True)

    anyio.run(serve)


if __name__ == "__main__":
    sys.exit(main())
