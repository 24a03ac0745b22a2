"""Administration commands: credentials are printed once and stored hashed."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from approvals.models import Approver
from audit.models import AuditEvent
from common.credentials import token_hash
from recovery.models import Host, Provider

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_create_host_prints_a_token_that_is_stored_only_as_a_hash():
    token = _run("create_host", "fleet-a")
    host = Host.objects.get(name="fleet-a")
    assert token.startswith("sth_") and token not in host.token_hash
    assert host.token_hash == token_hash(token)


def test_create_host_refuses_a_taken_name():
    _run("create_host", "fleet-a")
    with pytest.raises(CommandError, match="already exists"):
        _run("create_host", "fleet-a")


def test_create_approver_prints_a_working_token(client):
    token = _run("create_approver", "alice", "--all-providers")
    assert Approver.objects.get(name="alice").token_hash == token_hash(token)
    response = client.post(
        "/api/v1/approvals/00000000-0000-0000-0000-000000000000/decision",
        data={"decision": "approve", "params_digest": "sha256:" + "0" * 64},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_approval"


def test_add_provider_creates_then_updates_and_audits(tmp_path):
    path = str(tmp_path / "orders.sqlite3")
    (tmp_path / "orders.sqlite3").touch()
    assert _run("add_provider", "orders", "--adapter", "sqlite", "--path", path).startswith(
        "created provider orders"
    )
    out = _run(
        "add_provider",
        "orders",
        "--adapter",
        "sqlite",
        "--path",
        path,
        "--lease-seconds",
        "5",
        "--timeout-seconds",
        "1.5",
    )
    assert out.startswith("updated provider orders")
    provider = Provider.objects.get(name="orders")
    assert (provider.lease_seconds, provider.timeout_seconds) == (5, 1.5)
    assert AuditEvent.objects.filter(kind="provider_configured").count() == 2


def test_absent_is_authoritative_is_off_until_set_and_its_change_is_audited(tmp_path):
    path = str(tmp_path / "orders.sqlite3")
    (tmp_path / "orders.sqlite3").touch()
    _run("add_provider", "orders", "--adapter", "sqlite", "--path", path)
    assert Provider.objects.get(name="orders").absent_is_authoritative is False
    _run(
        "add_provider", "orders", "--adapter", "sqlite", "--path", path, "--absent-is-authoritative"
    )
    assert Provider.objects.get(name="orders").absent_is_authoritative is True
    changed = AuditEvent.objects.filter(kind="provider_configured").last()
    assert changed.data["changes"] == {"absent_is_authoritative": [False, True]}
    # Not given: kept as it is.
    _run("add_provider", "orders", "--adapter", "sqlite", "--path", path, "--lease-seconds", "9")
    assert Provider.objects.get(name="orders").absent_is_authoritative is True


def test_add_provider_refuses_a_path_with_no_file_unless_told(tmp_path):
    missing = str(tmp_path / "typo.sqlite3")
    with pytest.raises(CommandError, match=f"no file at {missing}"):
        _run("add_provider", "orders", "--adapter", "sqlite", "--path", missing)
    assert not Provider.objects.exists()
    _run("add_provider", "orders", "--adapter", "journal", "--path", missing, "--missing-ok")
    assert Provider.objects.get(name="orders").path == missing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--adapter", "sqlite"], "needs --path"),
        (["--adapter", "http", "--url", "http://127.0.0.1:9"], "needs --url and --secret"),
        (
            ["--adapter", "journal", "--path", "/j", "--missing-ok", "--timeout-seconds", "0"],
            "timeout",
        ),
        (["--adapter", "journal", "--path", "/j", "--missing-ok", "--lease-seconds", "0"], "lease"),
        (
            ["--adapter", "journal", "--path", "/j", "--missing-ok", "--lookup-budget", "0"],
            "lookup budget",
        ),
        (["--adapter", "journal", "--path", "relative/j.jsonl"], "must be absolute"),
        (["--adapter", "http", "--url", "ftp://h/x", "--secret", "s"], "http:// or https://"),
        (["--adapter", "http", "--url", "file:///etc/x", "--secret", "s"], "http:// or https://"),
        (["--adapter", "http", "--url", "http://h/x", "--secret", "s" * 4001], "longer than 4000"),
        (["--adapter", "mcp", "--secret", "https://h/mcp"], "must be a JSON object"),
        (["--adapter", "mcp", "--secret", '{"url": "ftp://h/mcp"}'], "http:// or https://"),
        (["--adapter", "mcp", "--secret", '{"url": "http://h/mcp", "auth": "x"}'], "unknown keys"),
        (["--adapter", "mcp", "--secret", '{"url": "http://h/", "bearer": 1}'], "bearer"),
        (["--adapter", "mcp", "--secret", '{"url": "http://h/", "headers": []}'], "headers"),
        (["--adapter", "mcp", "--secret", '{"url": "http://h/", "tool": ""}'], "tool"),
    ],
)
def test_add_provider_refuses_incomplete_settings(args, message):
    with pytest.raises(CommandError, match=message):
        _run("add_provider", "p", *args)
    assert not Provider.objects.exists()


def test_add_provider_configures_an_mcp_server_whose_description_stays_out_of_the_audit():
    secret = '{"url": "https://tools.example/mcp/tok-123", "tool": "evidence", "bearer": "b-9"}'
    _run("add_provider", "tools", "--adapter", "mcp", "--secret", secret)
    provider = Provider.objects.get(name="tools")
    assert (provider.adapter, provider.secret, provider.url) == ("mcp", secret, "")
    event = AuditEvent.objects.filter(kind="provider_configured").get()
    assert event.data["secret_changed"] is True
    assert "tok-123" not in str(event.data) and "b-9" not in str(event.data)
