"""``settle-mcp``: ``serve CONFIG`` (stdio, or ``--http HOST:PORT``) and ``check CONFIG``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from settle_client.mcp.config import ConfigError, load
from settle_client.mcp.upstreams import Upstreams


def problems(upstreams: Upstreams) -> list[ConfigError]:
    """What the live upstreams say is wrong with the gated tools, each at its line."""
    config = upstreams.config
    found: list[ConfigError] = []

    def wrong(message: str, table: str, key: str | None = None) -> None:
        found.append(ConfigError(message, path=config.path, line=config.line_of(table, key)))

    for name, gate in config.gated.items():
        where = f"gated.{name}"
        tool = upstreams.tools.get(name)
        if tool is None or upstreams.owner.get(name) != gate.upstream:
            offered = sorted(t for t, owner in upstreams.owner.items() if owner == gate.upstream)
            wrong(
                f"upstream {gate.upstream!r} has no tool {name!r} (it offers: "
                f"{', '.join(offered) or 'none'})",
                where,
            )
            continue
        properties = dict(tool.input_schema.get("properties") or {})
        if not gate.key_added and gate.key_argument not in properties:
            wrong(
                f"tool {name!r} has no argument {gate.key_argument!r} in its schema "
                f'(it has: {", ".join(sorted(properties)) or "none"}); use key = "added"',
                where,
                "key_argument",
            )
        if gate.key_added and "settle_key" in properties:
            wrong(f"tool {name!r} already has an argument 'settle_key'", where, "key")
        if gate.party_argument and gate.party_argument not in properties:
            wrong(f"tool {name!r} has no argument {gate.party_argument!r}", where, "party_argument")
        if gate.evidence_tool and upstreams.owner.get(gate.evidence_tool) != gate.upstream:
            wrong(
                f"upstream {gate.upstream!r} has no evidence tool {gate.evidence_tool!r}",
                where,
                "evidence_tool",
            )
    return found


async def _check(path: Path) -> int:
    config = load(path)
    async with Upstreams(config) as upstreams:
        found = problems(upstreams)
    for problem in found:
        print(problem, file=sys.stderr)
    if found:
        return 1
    gated = len(config.gated)
    tools, upstream_count = len(upstreams.tools), len(config.upstreams)
    print(f"{path}: ok: {tools} tools, {gated} gated, {upstream_count} upstreams")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="settle-mcp", description="An MCP gateway through Settle."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve MCP on stdio (or Streamable HTTP with --http)")
    serve.add_argument("config", type=Path)
    serve.add_argument(
        "--http", metavar="HOST:PORT", help="Streamable HTTP at /mcp instead of stdio"
    )
    check = sub.add_parser("check", help="check the config against the live upstreams")
    check.add_argument("config", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            return anyio.run(_check, args.config)
        config = load(args.config)
        config.token()
        from settle_client.mcp import server

        if args.http:
            host, _, port = args.http.rpartition(":")
            if not host or not port.isdigit():
                parser.error("--http takes HOST:PORT")
            anyio.run(server.serve_http, config, host, int(port))
        else:
            anyio.run(server.serve_stdio, config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
