"""settle-mcp: an MCP gateway that turns gated tool calls into Settle operations.

``pip install "settle-client[mcp]"``; ``settle-mcp serve CONFIG``; the configuration and
the key rule are in docs/mcp-gateway.md.
"""
