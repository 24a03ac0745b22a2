"""Point the MCP Python SDK's client at settle-mcp (stdio), call one gated tool twice.

    export SETTLE_HOST_TOKEN=...      # see README.md beside this file
    .venv/bin/python examples/mcp/sdk_client.py

The second call has the same key: it answers the first call's result, and the upstream's
journal holds one payment.
"""

from __future__ import annotations

import os

import anyio
from mcp import Client, StdioServerParameters

GATEWAY = StdioServerParameters(
    command=".venv/bin/settle-mcp",
    args=["serve", "examples/mcp/gateway.toml"],
    env={"SETTLE_HOST_TOKEN": os.environ["SETTLE_HOST_TOKEN"]},
)
PAYMENT = {"idempotency_key": "invoice-42", "payee": "acme", "amount": 40, "currency": "EUR"}


async def main() -> None:
    async with Client(GATEWAY, mode="legacy") as client:
        print([tool.name for tool in (await client.list_tools()).tools])
        for _ in range(2):
            result = await client.call_tool("send_payment", PAYMENT)
            print(result.is_error, result.structured_content or result.content[0])


if __name__ == "__main__":
    anyio.run(main)
