"""settle-mcp with parts nobody here wrote: a published MCP server (``mcp-server-sqlite``
from PyPI, unchanged) as the upstream, and the TypeScript SDK's client as the agent."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from recovery.models import Operation
from tests.support.mcp import REPO_ROOT, TOKEN_ENV
from tests.support.mcp import http_gateway as start_gateway

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SQLITE_SERVER = REPO_ROOT / ".venv" / "mcp-sqlite" / "bin" / "mcp-server-sqlite"
TS_CLIENT = REPO_ROOT / "tests" / "mcp" / "ts" / "client.mjs"
INSERT = "INSERT INTO notes (body) VALUES ('hello')"


def test_a_published_servers_write_tool_is_gated_and_its_read_tools_pass_through(
    mcp_setup, tmp_path
):
    assert SQLITE_SERVER.exists(), "make install-dev installs mcp-server-sqlite"
    database = tmp_path / "published.db"
    config = tmp_path / "sqlite.toml"
    config.write_text(f"""\
[settle]
url = "{mcp_setup.url}"
token_env = "{TOKEN_ENV}"

[upstreams.sqlite]
command = "{SQLITE_SERVER}"
args = ["--db-path", "{database}"]

[gated.write_query]
upstream = "sqlite"
provider = "payments"
action = "sql.write"
key = "added"
""")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "settle_client.mcp.cli", "serve", str(config)],
        env=mcp_setup.gateway_env(),
        cwd=str(REPO_ROOT),
    )

    async def scenario() -> tuple[Any, ...]:
        async with Client(params, mode="legacy", read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            await client.call_tool(
                "create_table", {"query": "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"}
            )
            first = await client.call_tool("write_query", {"query": INSERT, "settle_key": "w-1"})
            again = await client.call_tool("write_query", {"query": INSERT, "settle_key": "w-1"})
            rows = await client.call_tool("read_query", {"query": "SELECT body FROM notes"})
            return tools, first, again, rows

    tools, first, again, rows = anyio.run(scenario)
    assert {"read_query", "list_tables", "describe_table"} <= set(tools)
    assert "settle_key" in tools["write_query"].input_schema["required"]
    assert "settle_key" not in tools["read_query"].input_schema["properties"]
    assert not first.is_error, first.content
    assert again.content == first.content
    assert rows.content[0].text.count("hello") == 1  # one row: the repeat wrote nothing
    assert Operation.objects.get(key="w-1").params == {"query": INSERT}


def test_the_typescript_sdks_client_drives_the_gateway_over_streamable_http(
    mcp_setup, http_process
):
    assert (TS_CLIENT.parent / "node_modules").exists(), "make install-dev runs npm ci"
    url = start_gateway(mcp_setup, http_process)
    done = subprocess.run(
        [shutil.which("node") or "node", str(TS_CLIENT), url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert "send_payment" in answer["tools"] and "get_balance" in answer["tools"]
    assert answer["balance"]["structuredContent"] == {"account": "acct-2", "balance": 250}
    assert answer["payment"]["structuredContent"]["payment_id"] == "pay-ts-1"
    assert answer["again"]["structuredContent"] == answer["payment"]["structuredContent"]
    assert len(mcp_setup.effects("ts-1")) == 1
