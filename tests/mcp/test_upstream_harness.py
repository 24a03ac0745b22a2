"""harness/mcp_upstream.py, the test upstream: it journals every effect (a repeat too),
answers evidence by operation key, and can die right after committing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from settle_client.canonical import params_digest

from tests.support.mcp import REPO_ROOT

pytestmark = pytest.mark.processes

CALL = {"idempotency_key": "crash-1", "payee": "bob", "amount": 5, "currency": "EUR"}


def _messages(*calls: tuple[str, dict]) -> str:
    lines = [
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]
    for number, (name, arguments) in enumerate(calls, start=1):
        lines.append(
            {
                "jsonrpc": "2.0",
                "id": number,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            }
        )
    return "".join(json.dumps(line) + "\n" for line in lines)


class Done:
    def __init__(self, returncode: int | None, answers: dict[int, dict]) -> None:
        self.returncode, self.answers = returncode, answers


def _run(journal, *calls, die: str = "") -> Done:
    """Send the calls one by one, each after the last one's answer (stdin stays open: at
    its end the server stops); stop at the first that gets none (the process died)."""
    args = [sys.executable, "-m", "harness.mcp_upstream", "--journal", str(journal)]
    if die:
        args += ["--die-after-commit", die]
    process = subprocess.Popen(
        [*args, "stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert process.stdin is not None and process.stdout is not None
    answers: dict[int, dict] = {}
    lines = _messages(*calls).splitlines(keepends=True)
    wanted = [0, None, *range(1, len(calls) + 1)]  # the answers' ids (a notification: none)
    for line, want in zip(lines, wanted, strict=True):
        process.stdin.write(line)
        process.stdin.flush()
        if want is None:
            continue
        answer = process.stdout.readline()
        if not answer:
            break
        message = json.loads(answer)
        answers[message["id"]] = message.get("result", {})
    process.stdin.close()
    return Done(process.wait(timeout=30), answers)


def _record(answer: dict) -> dict:
    """The evidence tool's record: it has no output schema, so it comes as the JSON text of
    its one content item (as Settle's mcp adapter reads it)."""
    (content,) = answer["content"]
    return json.loads(content["text"])


def test_it_dies_after_committing_and_its_evidence_then_shows_the_effect(tmp_path):
    journal = tmp_path / "effects.sqlite3"
    died = _run(journal, ("send_payment", CALL), die="crash")
    assert died.returncode == 17
    assert 1 not in died.answers  # committed, never answered
    looked = _run(journal, ("lookup_effect", {"operation_key": "crash-1"})).answers
    evidence = _record(looked[1])
    params = {"payee": "bob", "amount": 5, "currency": "EUR"}
    assert evidence == {
        "found": True,
        "operation_key": "crash-1",
        "params_digest": params_digest(params),
        "result": {"payment_id": "pay-crash-1", "payee": "bob", "amount": 5},
        "count": 1,
    }


def test_every_call_is_an_effect_so_a_second_dispatch_shows_in_the_count(tmp_path):
    journal = tmp_path / "effects.sqlite3"
    done = _run(
        journal,
        ("send_payment", CALL),
        ("send_payment", CALL),
        ("lookup_effect", {"operation_key": "crash-1"}),
        ("lookup_effect", {"operation_key": "nothing"}),
    )
    answers = done.answers
    assert _record(answers[3])["count"] == 2
    assert _record(answers[4]) == {
        "found": False,
        "operation_key": "nothing",
        "count": 0,
    }
