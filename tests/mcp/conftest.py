"""The gateway's tests: settle-mcp as a real process, driven by the MCP SDK's client, in
front of a live Settle (pytest-django's live server, real HTTP) and a real upstream
(harness/mcp_upstream.py, or a published server)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.providers import _free_port
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.live import live_server_wide
from tests.support.mcp import REPO_ROOT, Setup, Staff, apply_policy


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    server = live_server_wide(request)
    yield server
    server.stop()


@pytest.fixture
def mcp_setup(live_server: Any, transactional_db: None, tmp_path: Path) -> Setup:
    journal = tmp_path / "provider-journal.jsonl"
    journal.touch()
    provider_configure(name="payments", adapter="journal", path=str(journal), lease_seconds=30)
    apply_policy(tmp_path, "1000")
    _, token = host_create(name="mcp-gateway")
    return Setup(live_server.url, token, tmp_path / "effects.sqlite3", tmp_path)


@pytest.fixture
def http_process(tmp_path: Path) -> Iterator[Any]:
    """``start(args, env)``: a process that prints ``ready`` once it listens; its URL."""
    started: list[subprocess.Popen[str]] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> str:
        import os

        port = _free_port()
        log = (tmp_path / f"proc-{port}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, *[a.replace("{port}", str(port)) for a in args]],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **(env or {})},
        )
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "ready":
            process.kill()
            raise AssertionError(
                f"{args} did not start: {line!r}\n{(tmp_path / f'proc-{port}.log').read_text()}"
            )
        return f"http://127.0.0.1:{port}/mcp"

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def signed_in_staff(mcp_setup: Setup) -> Staff:
    from recovery.models import Provider
    from tests.support.console import console_user

    provider = Provider.objects.get(name="payments")
    return Staff(console_user("dora", "decide_approvals", provider))
