"""The gateway's tests: settle-mcp as a real process, driven by the MCP SDK's client, in
front of a live Settle (pytest-django's live server, real HTTP) and a real upstream
(harness/mcp_upstream.py, or a published server)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from harness.providers import _free_port
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.integration.conftest import live_server

__all__ = ["live_server"]

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "SETTLE_MCP_TEST_TOKEN"

POLICY = """
[[rules]]
name = "small-payments"
provider = "payments"
action = "payment.send"
when = ["/amount <= 100"]
outcome = "approve"
reason = "small payments within the budget"

[rules.budget]
per = "action"
window = "24h"
sum = "/amount"
limit = "{limit}"

[[rules]]
name = "no-notes-to-mallory"
provider = "payments"
action = "note.send"
when = ['/to == "mallory"']
outcome = "deny"
reason = "notes to mallory are not allowed"

[[rules]]
name = "notes"
provider = "payments"
action = "note.send"
outcome = "approve"
reason = "notes need nobody"

[[rules]]
name = "sql-writes"
provider = "payments"
action = "sql.write"
outcome = "approve"
reason = "the published server's writes, in tests"
"""


@dataclass
class Setup:
    """A live Settle with a host token, a provider and a policy; the upstream's journal."""

    url: str
    token: str
    journal: Path
    directory: Path

    def config(self, *, http_upstream: str = "", extra: str = "", wait: float = 60) -> Path:
        """A gateway config: the test upstream (stdio, or at ``http_upstream``), its two
        write tools gated (``send_payment`` by its own key, ``send_note`` by an added one)."""
        if http_upstream:
            upstream = f'url = "{http_upstream}"'
        else:
            upstream = (
                f'command = "{sys.executable}"\n'
                f'args = ["-m", "harness.mcp_upstream", "--journal", "{self.journal}", "stdio"]\n'
                f'cwd = "{REPO_ROOT}"'
            )
        text = f"""\
[settle]
url = "{self.url}"
token_env = "{TOKEN_ENV}"
approval_wait_seconds = {wait}

[upstreams.test]
{upstream}

[gated.send_payment]
upstream = "test"
provider = "payments"
action = "payment.send"
key_argument = "idempotency_key"
evidence_tool = "lookup_effect"

[gated.send_note]
upstream = "test"
provider = "payments"
action = "note.send"
key = "added"
{extra}"""
        path = self.directory / f"gateway-{time.monotonic_ns()}.toml"
        path.write_text(text)
        return path

    def gateway_env(self) -> dict[str, str]:
        return {TOKEN_ENV: self.token, "PYTHONPATH": str(REPO_ROOT)}

    def effects(self, key: str | None = None) -> list[tuple[str, str]]:
        if not self.journal.exists():
            return []
        with sqlite3.connect(self.journal) as db:
            rows = db.execute("SELECT operation_key, params_digest FROM effects ORDER BY seq")
            return [row for row in rows if key is None or row[0] == key]


def apply_policy(directory: Path, limit: str) -> None:
    path = directory / "policy.toml"
    path.write_text(POLICY.replace("{limit}", limit))
    call_command("policy", "apply", str(path), "--yes", verbosity=0)


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


@dataclass
class Staff:
    """A console user who decides approvals on ``payments``, posting the console's form."""

    user: Any

    def decide(self, approval: Any, decision: str, reason: str = "") -> None:
        from django.test import Client

        from recovery.models import Operation

        client = Client()
        client.force_login(self.user)
        digest = Operation.objects.get(key=approval.operation_key).params_digest
        data = {"params_digest": digest, "decision": decision, "reason": reason}
        response = client.post(f"/approvals/{approval.pk}/decide", data)
        assert response.status_code == 302, response.content[:500]

    def approve(self, approval: Any) -> None:
        self.decide(approval, "approve")


@pytest.fixture
def signed_in_staff(mcp_setup: Setup) -> Staff:
    from recovery.models import Provider
    from tests.support.console import console_user

    provider = Provider.objects.get(name="payments")
    return Staff(console_user("dora", "decide_approvals", provider))
