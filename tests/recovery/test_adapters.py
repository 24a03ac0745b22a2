"""Provider adapters: every verdict of every adapter, against real provider artefacts.

The SQLite and journal providers are files written by ``harness.providers``; the HTTP
provider is the real ``harness/http_provider.py`` process. No Django database is used:
adapters never touch it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.canonical import canonical_dumps
from harness.providers import (
    HTTP_PROVIDER_SCRIPT,
    digest_of,
    http_provider_control,
    http_provider_history,
    http_provider_perform,
    http_provider_start,
    http_provider_stop,
    journal_append,
    journal_append_raw,
    sqlite_provider_commit,
    sqlite_provider_init,
    sqlite_provider_tamper,
)
from recovery import adapters
from recovery.adapters import LookupResult, ProviderConfig, evidence_lookup
from recovery.models import Verdict

PARAMS: dict[str, Any] = {"amount": 1250, "currency": "EUR", "to": "acct-42"}
DIGEST = digest_of(PARAMS)
OTHER_DIGEST = digest_of({"amount": 9999, "currency": "EUR", "to": "acct-42"})
KEY = "op-1"
SECRET = "provider-test-secret"


def lookup(config: ProviderConfig, key: str = KEY, digest: str = DIGEST) -> LookupResult:
    """Run a lookup and check what every result must satisfy, whatever the verdict."""
    result = evidence_lookup(config=config, operation_key=key, params_digest=digest)
    assert result.verdict in Verdict.values
    assert result.provider_status in {"committed", "failed", ""}
    assert result.detail
    assert len(result.detail) <= adapters.MAX_DETAIL_LENGTH
    text = json.dumps(result.raw)
    canonical_dumps(result.raw)  # raw is stored and digested as canonical JSON
    assert "\\u0000" not in text
    assert "\x00" not in result.reference + result.detail
    if result.verdict not in {Verdict.MATCH, Verdict.MISMATCH}:
        assert result.provider_status == ""
    return result


# --------------------------------------------------------------------------- sqlite


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    path = tmp_path / "provider.sqlite3"
    sqlite_provider_init(path)
    return path


def sqlite_config(path: Path, **overrides: Any) -> ProviderConfig:
    return ProviderConfig(adapter="sqlite", path=str(path), **overrides)


def test_sqlite_committed_record_with_same_params_is_match(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    result = lookup(sqlite_config(sqlite_path))
    assert result.verdict == Verdict.MATCH
    assert result.provider_status == "committed"
    assert result.reference == "ord-1"
    assert result.raw["order"]["reference"] == "ord-1"
    assert result.raw["receipt"]["params_digest"] == DIGEST


def test_sqlite_non_canonical_params_json_is_recanonicalised(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    with sqlite3.connect(sqlite_path) as connection:
        connection.execute(
            "UPDATE receipts SET params_json = ? WHERE operation_key = ?",
            (json.dumps(dict(reversed(PARAMS.items())), indent=2), KEY),
        )
    connection.close()
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.MATCH


def test_sqlite_receipt_for_other_params_is_mismatch(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "other_params")
    result = lookup(sqlite_config(sqlite_path))
    assert result.verdict == Verdict.MISMATCH
    assert result.provider_status == "committed"
    assert result.reference == "ord-1"


def test_sqlite_no_rows_for_key_is_absent(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key="op-other", params=PARAMS, reference="x")
    result = lookup(sqlite_config(sqlite_path))
    assert result.verdict == Verdict.ABSENT
    assert result.reference == ""


def test_sqlite_order_without_receipt_is_corrupt(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "delete_receipt")
    result = lookup(sqlite_config(sqlite_path))
    assert result.verdict == Verdict.CORRUPT
    assert result.raw["receipt"] is None


def test_sqlite_receipt_without_order_is_corrupt(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "delete_order")
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.CORRUPT


def test_sqlite_unparsable_params_json_is_corrupt(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "bad_json")
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.CORRUPT


def test_sqlite_stored_digest_not_matching_its_params_json_is_corrupt(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "wrong_stored_digest")
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.CORRUPT


def test_sqlite_unknown_order_status_is_corrupt(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "bad_status")
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.CORRUPT


def test_sqlite_recommit_restores_a_tampered_record(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "delete_receipt")
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.MATCH


def test_sqlite_commit_without_replace_refuses_a_duplicate(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    with pytest.raises(sqlite3.IntegrityError):
        sqlite_provider_commit(
            sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-2", replace=False
        )
    assert lookup(sqlite_config(sqlite_path)).reference == "ord-1"


def test_sqlite_missing_file_is_unavailable_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "nope.sqlite3"
    assert lookup(sqlite_config(path)).verdict == Verdict.UNAVAILABLE
    assert not path.exists()


def test_sqlite_locked_file_is_unavailable(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    holder = sqlite3.connect(sqlite_path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        result = lookup(sqlite_config(sqlite_path, timeout_seconds=0.2))
        assert result.verdict == Verdict.UNAVAILABLE
        assert "locked" in result.detail
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert lookup(sqlite_config(sqlite_path)).verdict == Verdict.MATCH


def test_sqlite_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"this is not a database, just some bytes" * 100)
    assert lookup(sqlite_config(path)).verdict == Verdict.UNAVAILABLE


def test_sqlite_database_without_provider_tables_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite3"
    sqlite3.connect(path).close()
    assert lookup(sqlite_config(path)).verdict == Verdict.UNAVAILABLE


def test_sqlite_path_needing_uri_quoting_is_read(tmp_path: Path) -> None:
    directory = tmp_path / "odd dir?#%"
    directory.mkdir()
    path = directory / "provider 1.sqlite3"
    sqlite_provider_commit(path, operation_key=KEY, params=PARAMS, reference="ord-1")
    assert lookup(sqlite_config(path)).verdict == Verdict.MATCH


def test_sqlite_lookup_never_writes(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord-1")
    sqlite_provider_tamper(sqlite_path, KEY, "wrong_stored_digest")
    before_bytes = sqlite_path.read_bytes()
    before_mtime = os.stat(sqlite_path).st_mtime_ns
    before_listing = sorted(p.name for p in sqlite_path.parent.iterdir())
    for key in (KEY, "op-absent"):
        lookup(sqlite_config(sqlite_path), key=key)
    assert sqlite_path.read_bytes() == before_bytes
    assert os.stat(sqlite_path).st_mtime_ns == before_mtime
    assert sorted(p.name for p in sqlite_path.parent.iterdir()) == before_listing


def test_sqlite_nul_characters_are_stripped_from_the_result(sqlite_path: Path) -> None:
    sqlite_provider_commit(sqlite_path, operation_key=KEY, params=PARAMS, reference="ord\x00-1")
    result = lookup(sqlite_config(sqlite_path))
    assert result.verdict == Verdict.MATCH
    assert result.reference == "ord-1"
    assert result.raw["order"]["reference"] == "ord-1"


# --------------------------------------------------------------------------- journal


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "provider.jsonl"


def journal_config(path: Path) -> ProviderConfig:
    return ProviderConfig(adapter="journal", path=str(path))


def test_journal_committed_line_with_same_digest_is_match(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1")
    result = lookup(journal_config(journal_path))
    assert result.verdict == Verdict.MATCH
    assert result.provider_status == "committed"
    assert result.reference == "j-1"
    assert result.raw["record"]["seq"] == 1


def test_journal_seq_defaults_to_max_plus_one(journal_path: Path) -> None:
    journal_append(journal_path, operation_key="a", params_digest=DIGEST, reference="r", seq=7)
    journal_append_raw(journal_path, "garbage")
    line = journal_append(journal_path, operation_key="b", params_digest=DIGEST, reference="r")
    assert line["seq"] == 8


def test_journal_highest_seq_counts(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-3", seq=3)
    journal_append(
        journal_path, operation_key=KEY, params_digest=OTHER_DIGEST, reference="j-1", seq=1
    )
    journal_append(
        journal_path,
        operation_key=KEY,
        params_digest=DIGEST,
        reference="j-2",
        status="failed",
        seq=2,
    )
    result = lookup(journal_config(journal_path))
    assert (result.verdict, result.provider_status, result.reference) == (
        Verdict.MATCH,
        "committed",
        "j-3",
    )
    journal_append(journal_path, operation_key=KEY, params_digest=OTHER_DIGEST, reference="j-4")
    assert lookup(journal_config(journal_path)).verdict == Verdict.MISMATCH


def test_journal_line_for_other_params_is_mismatch(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=OTHER_DIGEST, reference="j-1")
    result = lookup(journal_config(journal_path))
    assert result.verdict == Verdict.MISMATCH
    assert result.reference == "j-1"


def test_journal_without_line_for_key_is_absent(journal_path: Path) -> None:
    journal_append(journal_path, operation_key="op-10", params_digest=DIGEST, reference="x")
    journal_append(journal_path, operation_key="op-1x", params_digest=DIGEST, reference="x")
    assert lookup(journal_config(journal_path)).verdict == Verdict.ABSENT


def test_journal_empty_file_is_absent(journal_path: Path) -> None:
    journal_path.write_bytes(b"")
    assert lookup(journal_config(journal_path)).verdict == Verdict.ABSENT


def test_journal_missing_file_is_unavailable(journal_path: Path) -> None:
    assert lookup(journal_config(journal_path)).verdict == Verdict.UNAVAILABLE


def test_journal_unreadable_path_is_unavailable(tmp_path: Path) -> None:
    assert lookup(journal_config(tmp_path)).verdict == Verdict.UNAVAILABLE  # a directory


def test_journal_bad_checksum_is_corrupt(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1")
    journal_append(
        journal_path,
        operation_key=KEY,
        params_digest=DIGEST,
        reference="j-2",
        corrupt_checksum=True,
    )
    assert lookup(journal_config(journal_path)).verdict == Verdict.CORRUPT


def test_journal_edited_line_is_corrupt(journal_path: Path) -> None:
    line = journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1")
    journal_path.write_bytes(canonical_dumps({**line, "reference": "j-edited"}) + b"\n")
    assert lookup(journal_config(journal_path)).verdict == Verdict.CORRUPT


def test_journal_unparsable_line_for_key_is_corrupt(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1")
    journal_append_raw(journal_path, '{"seq": 9, "operation_key": "op-1", "ref')
    result = lookup(journal_config(journal_path))
    assert result.verdict == Verdict.CORRUPT
    assert result.raw["line_number"] == 2


def test_journal_broken_line_for_other_key_is_ignored(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1")
    journal_append_raw(journal_path, '{"seq": 9, "operation_key": "op-2", "ref')
    journal_append_raw(journal_path, b"\xff\xfe not even utf-8")
    journal_append(
        journal_path,
        operation_key="op-2",
        params_digest=DIGEST,
        reference="x",
        corrupt_checksum=True,
    )
    assert lookup(journal_config(journal_path)).verdict == Verdict.MATCH


def test_journal_unknown_status_is_corrupt(journal_path: Path) -> None:
    journal_append(
        journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-1", status="pending"
    )
    assert lookup(journal_config(journal_path)).verdict == Verdict.CORRUPT


def test_journal_same_seq_with_different_contents_is_corrupt(journal_path: Path) -> None:
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="a", seq=4)
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="b", seq=4)
    assert lookup(journal_config(journal_path)).verdict == Verdict.CORRUPT


def test_journal_many_lines_are_streamed(journal_path: Path) -> None:
    with open(journal_path, "wb") as handle:
        for seq in range(1, 20001):
            record = {
                "seq": seq,
                "operation_key": f"bulk-{seq}",
                "params_digest": OTHER_DIGEST,
                "reference": f"r-{seq}",
                "status": "committed",
                "committed_at": "2025-01-01T00:00:00+00:00",
            }
            handle.write(canonical_dumps(record) + b"\n")
    journal_append(journal_path, operation_key=KEY, params_digest=DIGEST, reference="j-last")
    result = lookup(journal_config(journal_path))
    assert result.verdict == Verdict.MATCH
    assert result.raw["record"]["seq"] == 20001


# --------------------------------------------------------------------------- http


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, base_url = http_provider_start(tmp_path_factory.mktemp("http_provider"), SECRET)
    try:
        yield base_url
    finally:
        http_provider_stop(process)


@pytest.fixture
def http_url(http_server: str) -> Iterator[str]:
    """The shared server, answering normally before and after each test."""
    http_provider_control(http_server, "normal")
    yield http_server
    http_provider_control(http_server, "normal")


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """An operation key unique to the test, since the HTTP server is shared."""
    return f"op/{request.node.name}"


def http_config(url: str, **overrides: Any) -> ProviderConfig:
    return ProviderConfig(adapter="http", url=url, **{"secret": SECRET, **overrides})


def perform(url: str, key: str, digest: str = DIGEST, **kwargs: Any) -> None:
    http_provider_perform(url, operation_key=key, params_digest=digest, reference="h-1", **kwargs)


def test_http_committed_effect_is_match(http_url: str, key: str) -> None:
    perform(http_url, key)
    result = lookup(http_config(http_url), key=key)
    assert result.verdict == Verdict.MATCH
    assert result.provider_status == "committed"
    assert result.reference == "h-1"
    assert result.raw["record"]["operation_key"] == key


def test_http_key_is_url_quoted(http_url: str) -> None:
    key = "op 1/../?x=1#frag&ü"
    perform(http_url, key)
    assert lookup(http_config(http_url), key=key).verdict == Verdict.MATCH


def test_http_effect_for_other_params_is_mismatch(http_url: str, key: str) -> None:
    perform(http_url, key, digest=OTHER_DIGEST)
    result = lookup(http_config(http_url), key=key)
    assert result.verdict == Verdict.MISMATCH
    assert result.reference == "h-1"


def test_http_latest_effect_counts(http_url: str, key: str) -> None:
    perform(http_url, key, digest=OTHER_DIGEST)
    perform(http_url, key)
    assert lookup(http_config(http_url), key=key).verdict == Verdict.MATCH
    assert len(http_provider_history(http_url, key)) == 2


def test_http_404_is_absent(http_url: str, key: str) -> None:
    assert lookup(http_config(http_url), key=key).verdict == Verdict.ABSENT


def test_http_bad_signature_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "bad_signature")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.CORRUPT


def test_http_missing_signature_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "no_signature")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.CORRUPT


def test_http_signature_with_other_secret_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key)
    assert lookup(http_config(http_url, secret="other"), key=key).verdict == Verdict.CORRUPT


def test_http_unparsable_signed_body_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "unparsable_body")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.CORRUPT


def test_http_body_for_other_key_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "wrong_key")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.CORRUPT


def test_http_unknown_status_is_corrupt(http_url: str, key: str) -> None:
    perform(http_url, key, status="pending")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.CORRUPT


def test_http_500_is_unavailable(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "error_500")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.UNAVAILABLE


def test_http_unexpected_status_is_unavailable(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "teapot")
    assert lookup(http_config(http_url), key=key).verdict == Verdict.UNAVAILABLE


def test_http_timeout_is_unavailable(http_url: str, key: str) -> None:
    perform(http_url, key)
    http_provider_control(http_url, "slow")
    result = lookup(http_config(http_url, timeout_seconds=0.5), key=key)
    assert result.verdict == Verdict.UNAVAILABLE


def test_http_connection_refused_is_unavailable(tmp_path: Path) -> None:
    process, url = http_provider_start(tmp_path, SECRET)
    http_provider_stop(process)
    assert lookup(http_config(url)).verdict == Verdict.UNAVAILABLE


def test_http_without_secret_is_unavailable(http_url: str, key: str) -> None:
    perform(http_url, key)
    assert lookup(http_config(http_url, secret=""), key=key).verdict == Verdict.UNAVAILABLE


def test_http_restarted_provider_keeps_its_effects(tmp_path: Path) -> None:
    process, url = http_provider_start(tmp_path, SECRET)
    try:
        perform(url, KEY)
    finally:
        http_provider_stop(process)
    process, url = http_provider_start(tmp_path, SECRET)
    try:
        assert lookup(http_config(url)).verdict == Verdict.MATCH
    finally:
        http_provider_stop(process)


# --------------------------------------------------------------------------- all adapters


@pytest.mark.parametrize("adapter", ["sqlite", "journal", "http"])
def test_failed_status_with_matching_digest_is_match_with_failed_status(
    adapter: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if adapter == "sqlite":
        path = tmp_path / "p.sqlite3"
        sqlite_provider_commit(
            path, operation_key=KEY, params=PARAMS, reference="f-1", status="failed"
        )
        config = sqlite_config(path)
    elif adapter == "journal":
        path = tmp_path / "p.jsonl"
        journal_append(
            path, operation_key=KEY, params_digest=DIGEST, reference="f-1", status="failed"
        )
        config = journal_config(path)
    else:
        url: str = request.getfixturevalue("http_url")
        key = f"op/failed-{tmp_path.name}"
        http_provider_perform(
            url, operation_key=key, params_digest=DIGEST, reference="f-1", status="failed"
        )
        result = lookup(http_config(url), key=key)
        assert (result.verdict, result.provider_status, result.reference) == (
            Verdict.MATCH,
            "failed",
            "f-1",
        )
        return
    result = lookup(config)
    assert (result.verdict, result.provider_status, result.reference) == (
        Verdict.MATCH,
        "failed",
        "f-1",
    )


def test_unknown_adapter_is_unavailable() -> None:
    result = lookup(ProviderConfig(adapter="carrier-pigeon"))
    assert result.verdict == Verdict.UNAVAILABLE
    assert "carrier-pigeon" in result.detail


@pytest.mark.parametrize("adapter", ["sqlite", "journal", "http"])
def test_missing_configuration_is_unavailable(adapter: str) -> None:
    assert lookup(ProviderConfig(adapter=adapter)).verdict == Verdict.UNAVAILABLE


def test_unexpected_exception_becomes_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object) -> LookupResult:
        raise RuntimeError("adapter bug \x00 here")

    monkeypatch.setitem(adapters._ADAPTERS, "sqlite", explode)
    result = lookup(ProviderConfig(adapter="sqlite", path="/nowhere"))
    assert result.verdict == Verdict.UNAVAILABLE
    assert "adapter bug" in result.detail


def test_http_provider_script_runs_standalone(tmp_path: Path) -> None:
    """Worker processes start the script by path, without the project on sys.path."""
    completed = subprocess.run(
        [sys.executable, "-I", str(HTTP_PROVIDER_SCRIPT), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "--port" in completed.stdout


# -- one safe-integer rule, through every adapter ----------------------------------------

UNSAFE = 2**53  # one past canonical JSON's largest exact integer


def _unsafe_sqlite(tmp_path: Path) -> ProviderConfig:
    """A provider whose orders table keeps ``created_at`` as an integer (epoch ns, say)."""
    path = tmp_path / "orders.sqlite3"
    sqlite_provider_init(path, created_at="INTEGER")
    sqlite_provider_commit(path, operation_key=KEY, params=PARAMS, reference="o-1")
    sqlite_provider_tamper(path, KEY, "huge_created_at")
    return sqlite_config(path)


def _unsafe_journal(tmp_path: Path) -> ProviderConfig:
    path = tmp_path / "provider.jsonl"
    line = {
        "operation_key": KEY,
        "params_digest": DIGEST,
        "reference": "j-1",
        "status": "committed",
        "seq": UNSAFE,
        "checksum": "sha256:" + "0" * 64,  # no canonical checksum exists for such a line
    }
    journal_append_raw(path, json.dumps(line))
    return journal_config(path)


def _unsafe_http(tmp_path: Path) -> Iterator[ProviderConfig]:
    """A provider that signs, correctly, a record holding an out-of-range integer."""
    import hashlib
    import hmac
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps(
        {
            "operation_key": KEY,
            "params_digest": DIGEST,
            "reference": "h-1",
            "status": "committed",
            "amount_cents": UNSAFE,
        }
    ).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Provider-Signature", signature)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield http_config(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(params=["sqlite", "journal", "http"])
def unsafe_record(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderConfig]:
    if request.param == "sqlite":
        yield _unsafe_sqlite(tmp_path)
    elif request.param == "journal":
        yield _unsafe_journal(tmp_path)
    else:
        yield from _unsafe_http(tmp_path)


def test_a_record_with_an_out_of_range_integer_is_corrupt_and_storable(
    unsafe_record: ProviderConfig,
) -> None:
    result = lookup(unsafe_record)  # also checks that the raw record is canonical JSON
    assert result.verdict == Verdict.CORRUPT
    assert str(UNSAFE) in json.dumps(result.raw)  # kept, as text
