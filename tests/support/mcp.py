"""The gateway tests' helpers (tests/mcp): a live Settle set up for settle-mcp, the
gateway started over stdio or Streamable HTTP, a staff user deciding in the console."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from django.core.management import call_command
from mcp import Client, StdioServerParameters

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


def stdio_gateway(setup: Setup, config: Any) -> Client:
    """The SDK's client, starting ``settle-mcp serve CONFIG`` as its stdio server."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "settle_client.mcp.cli", "serve", str(config)],
        env=setup.gateway_env(),
        cwd=str(REPO_ROOT),
    )
    return Client(params, mode="legacy", read_timeout_seconds=60)


def http_gateway(setup: Setup, http_process: Any) -> str:
    """The test upstream and the gateway, both over Streamable HTTP: the gateway's URL."""
    upstream = http_process(
        ["-m", "harness.mcp_upstream", "--journal", str(setup.journal), "http", "--port", "{port}"]
    )
    config = setup.config(http_upstream=upstream)
    return http_process(
        ["-m", "settle_client.mcp.cli", "serve", str(config), "--http", "127.0.0.1:{port}"],
        env=setup.gateway_env(),
    )


def in_thread(scenario: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run an async scenario in a thread: the test's own thread keeps its database
    connection, to decide in the console while the gateway waits."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = anyio.run(scenario)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome
