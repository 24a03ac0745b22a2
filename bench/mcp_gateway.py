"""What settle-mcp adds to a tool call: a passthrough call and an auto-approved gated call.

    python bench/mcp_gateway.py [--calls 300] [--seconds 10] [--agents 8] [--forwarder | --stdio]

On a scratch PostgreSQL database (``bench/api.py``'s), ``gunicorn settle.wsgi -w 4``, the
test upstream (``harness/mcp_upstream.py`` over Streamable HTTP) and one gateway
(``settle-mcp serve --http``) in front of it, all on this machine. One MCP SDK client
session to the upstream and one to the gateway take turns, call by call, so both meet the
same load. With ``--stdio`` every MCP hop is stdio instead, as a desktop assistant runs its
servers: the direct session starts its own upstream process, the gateway's session starts
a gateway (``settle-mcp serve``) that starts one of its own (the gateway still calls
Settle over HTTP); at ``--agents``, each agent its own processes.

* passthrough: ``get_balance`` through the gateway against the same call made directly;
* gated: ``send_payment`` (a new key each call: register, auto-approval by the policy,
  dispatch, the upstream's effect, the report) through the gateway against
  ``send_payment`` made directly.

With ``--forwarder``, ``get_balance`` is also timed through a bare HTTP forwarder in
front of the same upstream (``bench/mcp_forwarder.py``: uvicorn and httpx, as the gateway,
with nothing of MCP): what one more HTTP hop adds, whatever the gateway does in it.

Prints the p50 and p90 of each and what the gateway adds at p50 (targets: passthrough
< 2 ms, gated < 15 ms), then the rate of gated calls with ``--agents`` concurrent agents
(a session each) against the same agents calling the upstream directly. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/settle")

import django  # noqa: E402

django.setup()

import anyio  # noqa: E402
from django.core.management import call_command  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402

from bench.api_postgres import analyze, scratch_database  # noqa: E402
from bench.api_postgres import connection as db  # noqa: E402
from harness.gunicorn import database_url, gunicorn_running  # noqa: E402
from harness.processes import process_stop  # noqa: E402
from harness.providers import _free_port  # noqa: E402
from recovery.services.credentials import host_create  # noqa: E402
from recovery.services.providers import provider_configure  # noqa: E402

TOKEN_ENV = "SETTLE_MCP_BENCH_TOKEN"
UPSTREAM = ["-m", "harness.mcp_upstream", "--journal"]
GATEWAY = ["-m", "settle_client.mcp.cli", "serve"]
FORWARDER = ["-m", "bench.mcp_forwarder", "--port", "{port}"]
POLICY = """
[[rules]]
name = "bench-payments"
provider = "payments"
action = "payment.send"
outcome = "approve"
reason = "every payment of the benchmark"
"""


def started(args: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """A process that prints ``ready`` once it listens at the URL returned."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, *[arg.replace("{port}", str(port)) for arg in args]],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("a"),
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"{args} did not start:\n{log.read_text()[-3000:]}")
    return process, f"http://127.0.0.1:{port}/mcp"


Target = str | StdioServerParameters  # what an MCP session is opened to: a URL or a command


def upstream_stdio(journal: Path) -> StdioServerParameters:
    """The test upstream on stdio, started by the session that opens it."""
    return StdioServerParameters(
        command=sys.executable, args=[*UPSTREAM, str(journal), "stdio"], cwd=str(ROOT)
    )


def gateway_stdio(config: Path, token: str) -> StdioServerParameters:
    """``settle-mcp serve`` on stdio with ``config``, started by the session that opens it."""
    return StdioServerParameters(
        command=sys.executable,
        args=[*GATEWAY, str(config)],
        cwd=str(ROOT),
        env={**os.environ, TOKEN_ENV: token},
    )


def gateway_config(directory: Path, settle_url: str, upstream: Target) -> Path:
    if isinstance(upstream, str):
        where = f'url = "{upstream}"'
    else:
        where = f"command = {json.dumps(upstream.command)}\nargs = {json.dumps(upstream.args)}"
        where += f"\ncwd = {json.dumps(str(upstream.cwd))}"
    directory.mkdir(exist_ok=True)
    path = directory / "gateway.toml"
    path.write_text(
        f"""\
[settle]
url = "{settle_url}"
token_env = "{TOKEN_ENV}"

[upstreams.bench]
{where}

[gated.send_payment]
upstream = "bench"
provider = "payments"
action = "payment.send"
key_argument = "idempotency_key"
evidence_tool = "lookup_effect"
"""
    )
    return path


def payment(key: str) -> dict[str, Any]:
    return {"idempotency_key": key, "payee": "bob", "amount": 10, "currency": "EUR"}


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    began = time.perf_counter()
    result = await call()
    took = (time.perf_counter() - began) * 1000
    if result.is_error:
        raise RuntimeError(f"a call failed: {result.content}")
    return took


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def latencies(
    direct_url: Target, gateway_url: Target, calls: int, forwarder_url: str | None = None
) -> dict[str, list[float]]:
    """Each kind of call, direct and through the gateway (and the bare forwarder, when
    there is one), taking turns call by call."""
    kinds = ("read", "read_gw", "pay", "pay_gw") + (("read_fw",) if forwarder_url else ())
    took: dict[str, list[float]] = {kind: [] for kind in kinds}
    async with contextlib.AsyncExitStack() as stack:
        direct = await stack.enter_async_context(Client(direct_url, mode="legacy"))
        gw = await stack.enter_async_context(Client(gateway_url, mode="legacy"))
        fw = None
        if forwarder_url:
            fw = await stack.enter_async_context(Client(forwarder_url, mode="legacy"))
        balance = {"account": "acct-1"}
        for n in range(-20, calls):  # the first 20: warm-up, not counted
            direct_pay, gw_pay = payment(f"d-{n}"), payment(f"g-{n}")
            rounds = {
                "read": await timed(lambda: direct.call_tool("get_balance", balance)),
                "read_gw": await timed(lambda: gw.call_tool("get_balance", balance)),
                "pay": await timed(lambda: direct.call_tool("send_payment", direct_pay)),  # noqa: B023
                "pay_gw": await timed(lambda: gw.call_tool("send_payment", gw_pay)),  # noqa: B023
            }
            if fw is not None:
                rounds["read_fw"] = await timed(lambda: fw.call_tool("get_balance", balance))
            if n >= 0:
                for kind, value in rounds.items():
                    took[kind].append(value)
    return took


async def rate(targets: list[Target], seconds: float, tag: str) -> float:
    """Gated (or direct) payments per second with a session to each of ``targets`` calling
    at once; the clock starts once every session is open (over stdio, its processes
    started)."""
    done = [0]

    async def agent(index: int, client: Client, deadline: float) -> None:
        n = 0
        while time.monotonic() < deadline:
            result = await client.call_tool("send_payment", payment(f"{tag}-{index}-{n}"))
            if result.is_error:
                raise RuntimeError(f"a call failed: {result.content}")
            n += 1
            done[0] += 1

    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(Client(target, mode="legacy")) for target in targets
        ]
        began = time.monotonic()
        async with anyio.create_task_group() as group:
            for index, client in enumerate(clients):
                group.start_soon(agent, index, client, began + seconds)
        return done[0] / (time.monotonic() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind")
    parser.add_argument("--seconds", type=float, default=10.0, help="per rate measurement")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument(
        "--forwarder",
        action="store_true",
        help="also time get_balance through a bare HTTP forwarder (bench/mcp_forwarder.py)",
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="every MCP hop over stdio (a process started per session), not Streamable HTTP",
    )
    args = parser.parse_args()
    if args.stdio and args.forwarder:
        sys.exit("--forwarder measures an HTTP hop: not with --stdio")
    if db.vendor != "postgresql":
        sys.exit("bench/mcp_gateway.py measures PostgreSQL; set DATABASE_URL=postgres://…")
    with scratch_database() as settings, tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        upstream, upstream_url = started(
            [*UPSTREAM, str(scratch / "effects.sqlite3"), "http", "--port", "{port}"],
            scratch / "upstream.log",
        )
        gateway = forwarder = forwarder_url = None
        try:
            if args.forwarder:
                forwarder, forwarder_url = started(
                    [*FORWARDER, "--upstream", upstream_url], scratch / "forwarder.log"
                )
            secret = json.dumps({"url": upstream_url, "tool": "lookup_effect"})
            provider_configure(name="payments", adapter="mcp", secret=secret)
            (scratch / "policy.toml").write_text(POLICY)
            call_command("policy", "apply", str(scratch / "policy.toml"), "--yes", verbosity=0)
            _, token = host_create(name="bench-gateway")
            env = {
                "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
                "SETTLE_HOST_RATE_PER_SECOND": "0",
            }
            with gunicorn_running(
                database_url=database_url(settings), log_path=scratch / "gunicorn.log", env=env
            ) as server:
                sessions = args.agents + 1  # one for the latencies, then one per agent
                direct: list[Target]
                gated: list[Target]
                if args.stdio:
                    direct = [upstream_stdio(scratch / f"d-{n}.sqlite3") for n in range(sessions)]
                    gated = [
                        gateway_stdio(
                            gateway_config(
                                scratch / f"gateway-{n}",
                                server.url,
                                upstream_stdio(scratch / f"gated-{n}.sqlite3"),
                            ),
                            token,
                        )
                        for n in range(sessions)
                    ]
                else:
                    config = gateway_config(scratch, server.url, upstream_url)
                    gateway, gateway_url = started(
                        [*GATEWAY, str(config), "--http", "127.0.0.1:{port}"],
                        scratch / "gateway.log",
                        env={TOKEN_ENV: token},
                    )
                    direct, gated = [upstream_url] * sessions, [gateway_url] * sessions
                took = anyio.run(latencies, direct[0], gated[0], args.calls, forwarder_url)
                analyze()
                direct_rate = anyio.run(rate, direct[1:], args.seconds, "rd")
                gated_rate = anyio.run(rate, gated[1:], args.seconds, "rg")
        finally:
            for process in (gateway, forwarder):
                if process is not None:
                    process_stop(process, timeout=5)
            process_stop(upstream, timeout=5)

    p50 = {kind: statistics.median(values) for kind, values in took.items()}
    p90 = {kind: p(values, 90) for kind, values in took.items()}
    added_read = p50["read_gw"] - p50["read"]
    added_pay = p50["pay_gw"] - p50["pay"]
    added_fw = p50["read_fw"] - p50["read"] if "read_fw" in p50 else None
    for kind, name in (
        ("read", "get_balance direct"),
        ("read_gw", "get_balance through the gateway (passthrough)"),
        ("pay", "send_payment direct"),
        ("pay_gw", "send_payment through the gateway (gated, auto-approved)"),
        ("read_fw", "get_balance through a bare HTTP forwarder"),
    ):
        if kind not in p50:
            continue
        print(f"{name:56} p50 {p50[kind]:7.2f} ms  p90 {p90[kind]:7.2f} ms")
    print(
        f"added at p50: passthrough {added_read:.2f} ms (target < 2: "
        f"{'met' if added_read < 2 else 'not met'}), gated {added_pay:.2f} ms (target < 15: "
        f"{'met' if added_pay < 15 else 'not met'}); {args.calls} calls of each"
    )
    if added_fw is not None:
        print(f"added at p50 by the bare forwarder: {added_fw:.2f} ms")
    print(f"{args.agents} agents: gated {gated_rate:.1f} calls/s, direct {direct_rate:.1f} calls/s")
    print(
        json.dumps(
            {
                "calls": args.calls,
                "p50_ms": {kind: round(value, 2) for kind, value in p50.items()},
                "p90_ms": {kind: round(value, 2) for kind, value in p90.items()},
                "passthrough_added_p50_ms": round(added_read, 2),
                **({} if added_fw is None else {"forwarder_added_p50_ms": round(added_fw, 2)}),
                "gated_added_p50_ms": round(added_pay, 2),
                "agents": args.agents,
                "gated_calls_per_s": round(gated_rate, 1),
                "direct_calls_per_s": round(direct_rate, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
