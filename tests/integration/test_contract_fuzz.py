"""The contract, fuzzed: Schemathesis against a live server, from the API's own document.

``st run`` (Schemathesis's command, from the dev extra) reads ``/api/openapi.json`` from
the live server and sends what it generates from it, valid and invalid, with a host
token, and with an approver token on the approvals' endpoints: the examples, coverage,
fuzzing and stateful phases (the last follows the document's links, from a registration
to its approval, decision, dispatch and report), with every check it has. Any failure
— a 500, a status or a body the document does not declare, a valid request refused or an
invalid one accepted — fails the test, with Schemathesis's report of it.

Bounded: ``SETTLE_FUZZ_MAX_EXAMPLES`` cases per operation and phase (default 30), and the
whole command within ``TIMEOUT`` seconds. ``SETTLE_FUZZ_SEED`` replays a run (its seed is
in the report).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import Approval
from recovery.models import Operation
from tests.support.live import ProviderHandle, Settle

pytestmark = pytest.mark.processes

REPO_ROOT = Path(__file__).resolve().parents[2]
ST = Path(sys.executable).with_name("st")
MAX_EXAMPLES = int(os.environ.get("SETTLE_FUZZ_MAX_EXAMPLES", "30"))
SEED = os.environ.get("SETTLE_FUZZ_SEED", "35")
TIMEOUT = 240
# Approved as it opens, by the policy below: a registration the hooks give this action
# (tests/support/fuzz_hooks.py) has a permit without anyone's decision.
AUTO_ACTION = "fuzz.auto"
POLICY = f"""\
[[rules]]
name = "fuzz-auto"
action = "{AUTO_ACTION}"
outcome = "approve"
reason = "the contract fuzzer: approved as it opens, so that its links reach dispatch"
"""

# The host's token everywhere; the approver's on the approvals' own endpoints. A
# registration's and a report's coverage phases are left out: the params schema (a
# report's ``result`` has it too) spells each of its ten levels of nesting (so that it
# says the depth the server allows), which that phase walks level by level into some
# 9,000 requests; their fuzzing and stateful phases stay.
CONFIG = """\
headers = { Authorization = "Bearer ${SETTLE_FUZZ_HOST_TOKEN}" }

[[operations]]
include-path-regex = "^/api/v1/approvals/"
headers = { Authorization = "Bearer ${SETTLE_FUZZ_APPROVER_TOKEN}" }

[[operations]]
include-operation-id = "registerOperation"
phases.coverage.enabled = false

[[operations]]
include-operation-id = "reportResult"
phases.coverage.enabled = false
"""


def fuzz(url: str, *, settle: Settle, provider: str, directory: Path) -> tuple[int, str]:
    """Run ``st run`` against ``url``; its exit status and its report."""
    config = directory / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {
        **os.environ,
        "SETTLE_FUZZ_HOST_TOKEN": settle.host_token,
        "SETTLE_FUZZ_APPROVER_TOKEN": settle.approver.token,
        "SETTLE_FUZZ_PROVIDER": provider,
        "SETTLE_FUZZ_AUTO_ACTION": AUTO_ACTION,
        "SCHEMATHESIS_HOOKS": "tests.support.fuzz_hooks",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    command = [
        str(ST),
        "--config-file",
        str(config),
        "run",
        f"{url}/api/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        SEED,
        # One worker: Python 3.11's ast.parse, which Hypothesis calls to describe a
        # strategy, is not safe across threads ("AST constructor recursion depth mismatch").
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    try:
        done = subprocess.run(
            command,
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"st run took over {TIMEOUT} s:\n{exc.stdout}") from None
    report = done.stdout + done.stderr
    (directory / "report.txt").write_text(report)  # kept for reading after a run
    return done.returncode, report


def findings(report: str, size: int = 20_000) -> str:
    """The report from its first failure or error on (its whole text can be megabytes)."""
    starts = [report.find(mark) for mark in ("= FAILURES =", "= ERRORS =") if mark in report]
    tail = report[min(starts) :] if starts else report
    return tail if len(tail) <= size else tail[: size // 2] + "\n…\n" + tail[-size // 2 :]


def test_the_fuzzer_finds_nothing_the_document_does_not_say(
    settle: Settle, make_provider: Any, tmp_path: Path
) -> None:
    provider: ProviderHandle = make_provider("journal")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    call_command("policy", "apply", str(policy), "--yes")
    status, report = fuzz(
        settle.base_url, settle=settle, provider=provider.name, directory=tmp_path
    )
    assert status == 0, findings(report)
    # Its stateful phase went past the 404s of made-up keys and ids: it registered
    # operations, opened approvals on them and decided some with the approver's token.
    # (How far past, to a dispatch and its report, is chance: not asserted.)
    assert Operation.objects.exists(), report[-5000:]
    assert Approval.objects.filter(decided_by__startswith="approver:").exists(), report[-5000:]
