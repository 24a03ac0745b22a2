"""settle-mcp SIGKILLed at each moment of a gated call; a new gateway repeats the call.

Real processes throughout: Settle under gunicorn, a Celery worker whose lookups read the
upstream's record through the ``mcp`` adapter (``recovery.adapters.mcp``), the test
upstream (harness/mcp_upstream.py, Streamable HTTP, an effect journal that never
deduplicates) and gateway processes driven by the MCP SDK's client. In each round, one
gateway per moment runs ``CALLS`` calls and is SIGKILLed once they all are there:

``before_dispatch``
    approved by nobody yet (a staff approval, the gateway waiting through URL-mode
    elicitation); approved after the kill.
``after_dispatch``
    dispatched, the upstream holding the call before it commits (it commits after: the
    effect a crashed gateway cannot know of).
``after_commit``
    the upstream committed and holds its answer.
``after_report``
    the gateway reported the result to Settle.

A new gateway then repeats every call with the same key and arguments: each must end with
exactly one effect in the journal and the original outcome (success: a payment), with one
dispatch: 0 duplicates and 0 false successes over ``ROUNDS * 4 * CALLS`` trials.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from approvals.models import Approval
from harness.gunicorn import gunicorn_running
from harness.processes import process_stop
from harness.providers import _free_port
from recovery.models import Dispatch, Operation, Provider
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.console import console_user
from tests.support.live import wait_until
from tests.support.mcp import REPO_ROOT, Setup, Staff, apply_policy

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

POINTS = ("before_dispatch", "after_dispatch", "after_commit", "after_report")
ROUNDS = 2
CALLS = 7  # calls per moment per round: 2 * 4 * 7 = 56 trials
HOLD_SECONDS = 5.0  # how long the upstream holds a call before or after its commit
WAIT = 60.0


def _payment(key: str, point: str) -> dict[str, Any]:
    # Above the policy's 100 EUR, a payment needs a staff person: the gateway waits.
    amount = 500 if point == "before_dispatch" else 10
    return {"idempotency_key": key, "payee": "bob", "amount": amount, "currency": "EUR"}


def _started(args: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """A process that prints ``ready`` once it listens at the URL returned."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, *[arg.replace("{port}", str(port)) for arg in args]],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("a"),
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        raise AssertionError(f"{args} did not start: {line!r}\n{log.read_text()[-3000:]}")
    return process, f"http://127.0.0.1:{port}/mcp"


class Calls:
    """Calls made through one gateway, in a thread: their results or errors by key."""

    def __init__(self, url: str, calls: dict[str, dict[str, Any]]) -> None:
        self.results: dict[str, Any] = {}
        self.elicited: set[str] = set()
        self.thread = threading.Thread(target=anyio.run, args=(self._run, url, calls))
        self.thread.daemon = True
        self.thread.start()

    async def _run(self, url: str, calls: dict[str, dict[str, Any]]) -> None:
        async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            self.elicited.add(params.url)
            return types.ElicitResult(action="accept")

        try:
            async with Client(
                url, mode="legacy", elicitation_callback=elicit, read_timeout_seconds=WAIT
            ) as client:
                # The SDK's client checks each answer against send_payment's output
                # schema, a result confirmed from the upstream's record included.
                async def one(key: str, arguments: dict[str, Any]) -> None:
                    try:
                        self.results[key] = await client.call_tool("send_payment", arguments)
                    except Exception as exc:  # the gateway died under the call
                        self.results[key] = exc

                async with anyio.create_task_group() as group:
                    for key, arguments in calls.items():
                        group.start_soon(one, key, arguments)
        except BaseException as exc:  # the session itself broke with the gateway
            for key in calls:
                self.results.setdefault(key, exc)

    def join(self) -> dict[str, Any]:
        self.thread.join(timeout=WAIT * 2)
        assert not self.thread.is_alive(), "the calls did not end"
        return self.results


def _there(point: str, keys: list[str], setup: Setup, calls: Calls) -> bool:
    """Whether every call of ``point`` has reached that moment."""
    operations = Operation.objects.filter(key__in=keys)
    if point == "before_dispatch":
        waiting = operations.filter(state="awaiting_approval").count() == len(keys)
        return waiting and len(calls.elicited) == len(keys)
    if point == "after_dispatch":
        # Dispatched, and the upstream holds the call before its commit (its log says so).
        held = (setup.directory / "upstream.log").read_text()
        return all(f"holding {key}\n" in held for key in keys)
    if point == "after_commit":
        return all(setup.effects(key) for key in keys)
    return operations.filter(state="released").count() == len(keys)


@pytest.fixture
def stack(transactional_db: None, tmp_path: Path, celery_env: Any, celery_procs: Any) -> Any:
    """Settle under gunicorn with a lookup worker, the upstream, and a gateway config."""
    env = {**celery_env, "SETTLE_MCP_ALLOW_PRIVATE": "true"}
    journal = tmp_path / "effects.sqlite3"
    upstream, upstream_url = _started(
        [
            "-m",
            "harness.mcp_upstream",
            "--journal",
            str(journal),
            "--sleep-before-commit",
            "after_dispatch",
            "--sleep-after-commit",
            "after_commit",
            "--sleep-seconds",
            str(HOLD_SECONDS),
            "http",
            "--port",
            "{port}",
        ],
        tmp_path / "upstream.log",
    )
    secret = f'{{"url": "{upstream_url}", "tool": "lookup_effect"}}'
    provider_configure(
        name="payments", adapter="mcp", secret=secret, lease_seconds=1, lookup_budget=5
    )
    apply_policy(tmp_path, "1000000")
    _, token = host_create(name="mcp-gateway")
    staff = Staff(console_user("dora", "decide_approvals", Provider.objects.get(name="payments")))
    try:
        with gunicorn_running(
            database_url=str(env["DATABASE_URL"]),
            log_path=tmp_path / "gunicorn.log",
            workers=2,
            env={k: v for k, v in env.items() if k != "DATABASE_URL"},
        ) as server:
            celery_procs("worker", env)
            setup = Setup(server.url, token, journal, tmp_path)
            yield setup, setup.config(http_upstream=upstream_url, wait=WAIT), staff
    finally:
        process_stop(upstream, timeout=5)


def _gateway(setup: Setup, config: Path) -> tuple[Any, str]:
    return _started(
        ["-m", "settle_client.mcp.cli", "serve", str(config), "--http", "127.0.0.1:{port}"],
        setup.directory / "gateways.log",
        env=setup.gateway_env(),
    )


def _round(number: int, setup: Setup, config: Path, staff: Staff) -> dict[str, str]:
    """One round: a gateway per moment killed there, a new one repeats every call."""
    keys = {point: [f"r{number}-{point}-{i}" for i in range(CALLS)] for point in POINTS}
    # All gateways listen before any call starts: each is watched from its calls' start.
    gateways = {point: _gateway(setup, config) for point in POINTS}
    runs = {
        point: (process, Calls(url, {key: _payment(key, point) for key in keys[point]}))
        for point, (process, url) in gateways.items()
    }
    # Each gateway is killed as soon as all its calls are at its moment.
    alive = dict(runs)

    def kill_those_there() -> bool:
        for point, (process, calls) in list(alive.items()):
            if _there(point, keys[point], setup, calls):
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
                del alive[point]
        return not alive

    wait_until(kill_those_there, WAIT, f"round {number}: every moment", step=0.02)
    states = {
        point: set(Operation.objects.filter(key__in=keys[point]).values_list("state", flat=True))
        for point in POINTS
    }
    # Killed where meant: nothing dispatched, nothing reported yet, or all reported.
    assert states["before_dispatch"] == {"awaiting_approval"}, states
    # Not reported (the lease of 1 s may have lapsed already: unknown).
    assert states["after_dispatch"] | states["after_commit"] <= {"dispatched", "unknown"}, states
    held = keys["after_dispatch"] + keys["after_commit"]
    reported = Dispatch.objects.filter(operation__key__in=held).exclude(receipt_status="running")
    assert not reported.exists(), states
    assert states["after_report"] == {"released"}, states
    assert not any(setup.effects(key) for key in keys["after_dispatch"])
    for _, calls in runs.values():
        calls.join()

    for approval in Approval.objects.filter(operation_key__in=keys["before_dispatch"]):
        staff.approve(approval)
    # The upstream still commits what it held when its caller died.
    wait_until(
        lambda: all(setup.effects(key) for key in keys["after_dispatch"]),
        WAIT,
        "the held calls committed",
    )

    process, url = _gateway(setup, config)
    try:
        every = {key: _payment(key, point) for point in POINTS for key in keys[point]}
        results = Calls(url, every).join()
    finally:
        process_stop(process, timeout=5)

    outcomes: dict[str, str] = {}
    for point in POINTS:
        for key in keys[point]:
            result = results[key]
            effects = len(setup.effects(key))
            assert effects == 1, f"{key}: {effects} effects"
            assert Dispatch.objects.filter(operation__key=key).count() == 1, key
            assert isinstance(result, types.CallToolResult), f"{key}: {result!r}"
            assert not result.is_error, f"{key}: {result.content}"
            operation = Operation.objects.get(key=key)
            assert operation.state == "released", key
            # Its own result: run now, kept by Settle from the first report, or given by
            # the upstream's evidence tool with the record that confirmed it.
            assert result.structured_content["payment_id"] == f"pay-{key}", result
            recovered = point not in ("before_dispatch", "after_report")
            assert operation.dispatch.receipt_recovered is recovered, key
            outcomes[key] = point
    return outcomes


def test_a_gateway_killed_at_any_moment_leaves_one_effect_and_the_original_outcome(
    stack: Any,
) -> None:
    setup, config, staff = stack
    trials: dict[str, str] = {}
    for number in range(ROUNDS):
        trials.update(_round(number, setup, config, staff))
    assert len(trials) == ROUNDS * len(POINTS) * CALLS >= 50
    # Every effect in the journal is one of these calls' (nothing else, nothing twice).
    assert len(setup.effects()) == len(trials)
