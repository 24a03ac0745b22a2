"""The gateway keeps its connection to a Streamable HTTP upstream from call to call,
instead of a new TCP connection (a handshake, the server's setup) for each."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import anyio
import psutil
import pytest
from settle_client.mcp.config import load
from settle_client.mcp.upstreams import KEEP_ALIVE_SECONDS, Upstreams

pytestmark = pytest.mark.processes

CALLS = 40


def _connections_to(port: int) -> set[tuple[str, int]]:
    """The local ends of every TCP connection to ``port`` (open or closing), this machine's."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port
    }


def test_calls_to_an_http_upstream_share_its_connection(http_process, tmp_path: Path):
    # Each answer's stream ends a moment after its result event, which the SDK's client
    # reads and closes the stream on: the end is still on its way.
    upstream = ["-m", "harness.mcp_upstream", "--journal", str(tmp_path / "journal"), "http"]
    url = http_process([*upstream, "--port", "{port}", "--end-late", "0.003"])
    port = urlsplit(url).port
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[settle]\nurl = "http://127.0.0.1:9"\ntoken_env = "UNUSED"\n\n'
        f'[upstreams.test]\nurl = "{url}"\n'
    )

    async def scenario() -> tuple[set[tuple[str, int]], list[int]]:
        async with Upstreams(load(config)) as upstreams:
            await upstreams.call("get_balance", {"account": "acct-1"})
            before = _connections_to(port)
            balances = [
                (await upstreams.call("get_balance", {"account": "acct-1"})).structured_content
                for _ in range(CALLS)
            ]
            used = _connections_to(port) - before
            # Idle past the bound it is kept, the next call opens a new one and succeeds.
            await anyio.sleep(KEEP_ALIVE_SECONDS + 0.2)
            after = await upstreams.call("get_balance", {"account": "acct-1"})
            return used, [b["balance"] for b in [*balances, after.structured_content]]

    used, balances = anyio.run(scenario)
    assert balances == [1000] * (CALLS + 1)
    # Without the kept connections: one a call (each left closing, in TIME_WAIT). With
    # them, a few: a call goes while the one before is still reading its stream's end.
    assert len(used) <= CALLS // 4, used
