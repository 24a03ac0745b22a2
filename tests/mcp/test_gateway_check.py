"""``settle-mcp check``: the config against the live upstreams, each fault at its line;
the file's own shape, refused with the line before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from settle_client.mcp.config import ConfigError, load

from tests.support.mcp import REPO_ROOT

UPSTREAM = f"""\
[settle]
url = "http://127.0.0.1:9"
token_env = "SETTLE_MCP_TEST_TOKEN"

[upstreams.test]
command = "{sys.executable}"
args = ["-m", "harness.mcp_upstream", "--journal", "JOURNAL", "stdio"]
cwd = "{REPO_ROOT}"
"""


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "settle_client.mcp.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def write(tmp_path: Path, gated: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(UPSTREAM.replace("JOURNAL", str(tmp_path / "j.sqlite3")) + gated)
    return path


@pytest.mark.processes
def test_check_names_the_line_of_a_missing_tool_and_of_a_key_argument_the_schema_lacks(
    tmp_path,
):
    path = write(
        tmp_path,
        """
[gated.send_payment]
upstream = "test"
provider = "payments"
action = "payment.send"
key_argument = "request_id"

[gated.wire_money]
upstream = "test"
provider = "payments"
action = "wire"
key = "added"
""",
    )
    lines = path.read_text().splitlines()
    key_line = lines.index('key_argument = "request_id"') + 1
    tool_line = lines.index("[gated.wire_money]") + 1
    done = check(path)
    assert done.returncode == 1, done.stderr
    assert f"{path}:{key_line}: tool 'send_payment' has no argument 'request_id'" in done.stderr
    assert "idempotency_key" in done.stderr  # what it does have
    assert f"{path}:{tool_line}: upstream 'test' has no tool 'wire_money'" in done.stderr


@pytest.mark.processes
def test_check_passes_a_config_that_matches_its_upstreams(tmp_path):
    path = write(
        tmp_path,
        """
[gated.send_payment]
upstream = "test"
provider = "payments"
action = "payment.send"
key_argument = "idempotency_key"
evidence_tool = "lookup_effect"
""",
    )
    done = check(path)
    assert done.returncode == 0, done.stderr
    assert "ok: 5 tools, 1 gated, 1 upstreams" in done.stdout


@pytest.mark.parametrize(
    ("gated", "message", "at"),
    [
        ('[gated.x]\nupstream = "nope"\nprovider = "p"\naction = "a"\nkey = "added"\n',
         "no upstream named 'nope'", 'upstream = "nope"'),
        ('[gated.x]\nupstream = "test"\nprovider = "p"\naction = "a"\n',
         'give key_argument = "ARG" or key = "added"', "[gated.x]"),
        ('[gated.x]\nupstream = "test"\nprovider = "p"\naction = "a"\nkey = "mine"\n',
         'key may only be "added"', 'key = "mine"'),
        ('[gated.x]\nupstream = "test"\naction = "a"\nkey = "added"\n',
         "provider must be a non-empty string", "[gated.x]"),
        ("[gated.x\n", "Expected ']'", "[gated.x"),
    ],
)  # fmt: skip
def test_a_config_of_the_wrong_shape_is_refused_at_its_line(tmp_path, gated, message, at):
    path = write(tmp_path, gated)
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert message in refused.value.message
    assert refused.value.line == path.read_text().splitlines().index(at) + 1


@pytest.mark.processes
def test_serve_without_the_token_variable_says_which_and_exits(tmp_path):
    path = write(tmp_path, "")
    done = subprocess.run(
        [sys.executable, "-m", "settle_client.mcp.cli", "serve", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin"},
    )
    assert done.returncode == 2
    assert "SETTLE_MCP_TEST_TOKEN is not set" in done.stderr


@pytest.mark.processes
def test_the_examples_config_passes_check_against_its_upstream():
    done = subprocess.run(
        [sys.executable, "-m", "settle_client.mcp.cli", "check", "examples/mcp/gateway.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "ok: 5 tools, 2 gated, 1 upstreams" in done.stdout
