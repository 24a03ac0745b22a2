"""The MCP adapter against a real MCP server (the official SDK's, over Streamable HTTP).

The test upstream (harness/mcp_upstream.py) runs as a process of its own: its journal's
real effects give match, mismatch and absent; the answers it is told to give
(``--answers``) the shapes no sound server gives; and each failure to ask it, the
deadline, the size cap and the address check.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from harness.processes import process_stop
from harness.providers import _free_port, digest_of
from recovery.adapters import MAX_RECORD_BYTES, LookupResult, ProviderConfig, evidence_lookup
from recovery.models import Verdict
from tests.support.flow import PARAMS

DIGEST = digest_of({"amount": 1250, "currency": "EUR", "to": "acct-42"})
KEY = "op-1"
TOKEN = "mcp-test-token"


def _record(key: str = KEY, **overrides: Any) -> dict[str, Any]:
    record = {
        "operation_key": key,
        "found": True,
        "params_digest": DIGEST,
        "status": "committed",
        "reference": "ref-1",
    }
    return {**record, **overrides}


class Server:
    """The test upstream (harness/mcp_upstream.py) over Streamable HTTP: its URL, its
    journal's real effects, and the answers it is told to give instead."""

    def __init__(self, url: str, answers: Path) -> None:
        self.url = url
        self._answers = answers

    def answer(self, key: str, answer: dict[str, Any]) -> None:
        self._answers.write_text(json.dumps({key: answer}))

    def pay(self, key: str, params: dict[str, Any]) -> None:
        """A real effect: ``send_payment`` called with ``key`` and ``params``."""

        async def call() -> None:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with (
                httpx2.AsyncClient(headers=headers) as client,
                streamable_http_client(self.url, http_client=client) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool("send_payment", {"idempotency_key": key, **params})
                assert not result.is_error, result

        anyio.run(call)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("mcp")
    answers = directory / "answers.json"
    answers.write_text("{}")
    port = _free_port()
    command = [sys.executable, "-m", "harness.mcp_upstream", "--journal"]
    command += [str(directory / "effects.sqlite3"), "--answers", str(answers)]
    command += ["http", "--port", str(port), "--bearer", TOKEN]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", "the MCP upstream did not start"
    try:
        yield Server(f"http://127.0.0.1:{port}/mcp", answers)
    finally:
        # A second's grace: the slow tool's call is still sleeping in a thread, which
        # would hold the process's exit for the rest of its ten seconds.
        process_stop(process, timeout=1)


def _secret(url: str, **extra: Any) -> str:
    return json.dumps({"url": url, "tool": "lookup_effect", "bearer": TOKEN, **extra})


def _lookup(
    secret: str,
    key: str = KEY,
    *,
    digest: str = DIGEST,
    allow_private: bool = True,
    **overrides: Any,
) -> LookupResult:
    config = ProviderConfig(adapter="mcp", secret=secret, allow_private=allow_private, **overrides)
    return evidence_lookup(config=config, operation_key=key, params_digest=digest)


def test_the_upstreams_record_of_a_real_effect_is_a_match_and_other_params_a_mismatch(
    server: Server,
) -> None:
    params = {"payee": "acct-42", "amount": 1250, "currency": "EUR"}
    server.pay("op-paid", params)
    result = _lookup(_secret(server.url), key="op-paid", digest=digest_of(params))
    assert (result.verdict, result.provider_status) == (Verdict.MATCH, "committed"), result
    assert result.raw["record"]["count"] == 1
    other = _lookup(_secret(server.url), key="op-paid", digest=digest_of({**params, "amount": 1}))
    assert other.verdict == Verdict.MISMATCH, other


def test_the_upstreams_answer_for_a_key_it_never_saw_is_absent(server: Server) -> None:
    result = _lookup(_secret(server.url), key="op-never-paid")
    assert result.verdict == Verdict.ABSENT, result


@pytest.mark.parametrize("form", ["structured", "text"])
def test_a_listed_record_for_the_key_with_these_params_is_a_match(
    server: Server, form: str
) -> None:
    record = _record()
    server.answer(
        KEY, {"structured": record} if form == "structured" else {"text": json.dumps(record)}
    )
    result = _lookup(_secret(server.url))
    assert result.verdict == Verdict.MATCH, result
    assert (result.provider_status, result.reference) == ("committed", "ref-1")
    assert result.raw == {"record": record}


def test_a_failed_record_is_a_match_that_says_failed(server: Server) -> None:
    server.answer(KEY, {"structured": _record(status="failed")})
    result = _lookup(_secret(server.url))
    assert (result.verdict, result.provider_status) == (Verdict.MATCH, "failed")


def test_a_record_without_status_or_reference_is_of_an_effect_done(server: Server) -> None:
    record = {"operation_key": KEY, "found": True, "params_digest": DIGEST, "count": 1}
    server.answer(KEY, {"structured": record})
    result = _lookup(_secret(server.url))
    assert (result.verdict, result.provider_status, result.reference) == (
        Verdict.MATCH,
        "committed",
        "",
    )
    assert result.raw == {"record": record}


def test_a_record_for_other_params_is_a_mismatch(server: Server) -> None:
    server.answer(KEY, {"structured": _record(params_digest="0" * 64)})
    result = _lookup(_secret(server.url))
    assert result.verdict == Verdict.MISMATCH, result
    assert "0" * 64 in result.detail


def test_found_false_is_absent(server: Server) -> None:
    result = _lookup(_secret(server.url), key="op-never")
    assert result.verdict == Verdict.ABSENT, result
    assert result.raw["record"]["found"] is False


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"text": "committed, I think"}, "not valid JSON"),
        ({"text": "[1, 2]"}, "not a JSON object"),
        ({"structured": _record(key="op-other")}, "'op-other'"),
        ({"structured": {"operation_key": KEY}}, "boolean 'found'"),
        ({"structured": _record(found="yes")}, "boolean 'found'"),
        ({"structured": _record(status="pending")}, "neither committed nor failed"),
        ({"structured": _record(params_digest=None)}, "'params_digest'"),
        ({"structured": _record(status=None)}, "'status'"),
        ({"structured": _record(reference=7)}, "'reference'"),
        ({"text": '{"operation_key": "op-1", "found": false, "found": true}'}, "not valid JSON"),
    ],
    ids=[
        "prose",
        "array",
        "other-key",
        "no-found",
        "found-text",
        "status",
        "digest",
        "status-null",
        "reference-number",
        "dup-key",
    ],
)
def test_an_answer_of_another_shape_is_corrupt(
    server: Server, answer: dict[str, Any], said: str
) -> None:
    server.answer(KEY, answer)
    result = _lookup(_secret(server.url))
    assert result.verdict == Verdict.CORRUPT, result
    assert said in result.detail, result.detail
    assert (result.provider_status, result.reference) == ("", "")


def test_an_answer_larger_than_the_cap_is_corrupt(server: Server) -> None:
    padding = "x" * (MAX_RECORD_BYTES + 1)
    server.answer(KEY, {"structured": _record(reference="r", padding=padding)})
    result = _lookup(_secret(server.url))
    assert result.verdict == Verdict.CORRUPT, result
    assert "larger than" in result.detail


def test_a_tool_error_is_unavailable(server: Server) -> None:
    server.answer(KEY, {"error": "the ledger is locked"})
    result = _lookup(_secret(server.url))
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert "the ledger is locked" in result.detail


def test_a_tool_the_server_does_not_have_is_unavailable(server: Server) -> None:
    server.answer(KEY, {"structured": _record()})
    result = _lookup(_secret(server.url, tool="evidence"))
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert result.raw["error"] == "tool_error"


def test_the_bearer_token_is_sent_and_a_wrong_one_is_unavailable(server: Server) -> None:
    server.answer(KEY, {"structured": _record()})
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    headers = json.dumps({"url": server.url, "tool": "lookup_effect", "headers": bearer})
    assert _lookup(headers).verdict == Verdict.MATCH
    wrong = _lookup(json.dumps({"url": server.url, "tool": "lookup_effect", "bearer": "guess"}))
    assert wrong.verdict == Verdict.UNAVAILABLE, wrong
    assert "401" in wrong.detail


def test_a_server_that_is_down_is_unavailable() -> None:
    result = _lookup(_secret(f"http://127.0.0.1:{_free_port()}/mcp"))
    assert result.verdict == Verdict.UNAVAILABLE, result


def test_a_slow_tool_is_cut_at_the_providers_timeout(server: Server) -> None:
    server.answer(KEY, {"sleep": 10, "structured": _record()})
    began = time.monotonic()
    result = _lookup(_secret(server.url), timeout_seconds=1.0)
    took = time.monotonic() - began
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert result.raw["error"] == "timeout"
    assert 0.9 <= took < 3, took


@contextlib.contextmanager
def _listener() -> Iterator[tuple[int, list[object]]]:
    """A port that counts the connections made to it."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                accepted.append(connection)
                connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1]), accepted
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_private_address_is_refused_without_a_connection(host: str) -> None:
    with _listener() as (port, accepted):
        result = _lookup(_secret(f"http://{host}:{port}/mcp"), allow_private=False)
        time.sleep(0.2)  # a connection, had one been made, is accepted by now
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert result.raw["error"] == "address_refused"
    assert "127.0.0.1" in result.detail or "::1" in result.detail
    assert accepted == []


@pytest.mark.parametrize(
    ("secret", "error"),
    [
        ("", "no_evidence_tool"),
        ("https://tools.example/mcp", "bad_secret"),
        ('{"tool": "x"}', "bad_secret"),
    ],
)
def test_a_provider_without_a_usable_server_is_unavailable(secret: str, error: str) -> None:
    result = _lookup(secret)
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert result.raw["error"] == error


# -- through the lookup service: what an operation of an mcp provider becomes --------------


def _crashed(flow: Any, key: str = "op-1") -> None:
    """Approved, dispatched, and the worker's lease lapsed: the operation is uncertain."""
    from datetime import timedelta

    from django.utils import timezone

    from recovery.models import Dispatch

    flow.approved(key)
    assert flow.dispatch(key).status_code == 200
    Dispatch.objects.filter(operation__key=key).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def _provider_mcp(secret: str, **settings: Any) -> None:
    from recovery.services.providers import provider_configure

    provider_configure(name="orders", adapter="mcp", secret=secret, **settings)


@pytest.mark.django_db
def test_a_crashed_operation_is_released_from_the_mcp_servers_record(
    server: Server, flow: Any, settings: Any
) -> None:
    settings.SETTLE_MCP_ALLOW_PRIVATE = True
    _provider_mcp(_secret(server.url))
    _crashed(flow)
    server.answer("op-1", {"structured": _record(key="op-1", params_digest=digest_of(PARAMS))})
    assert flow.resume_looked_up() == {
        "decision": "released",
        "state": "released",
        "recovered": True,
    }


@pytest.mark.django_db
def test_the_address_check_holds_in_the_lookup_service_unless_private_is_allowed(
    server: Server, flow: Any, settings: Any
) -> None:
    from recovery.models import Evidence

    settings.SETTLE_MCP_ALLOW_PRIVATE = False
    _provider_mcp(_secret(server.url), lookup_budget=1)
    _crashed(flow)
    server.answer("op-1", {"structured": _record(key="op-1")})
    assert flow.resume_looked_up()["state"] == "reconcile"
    assert Evidence.objects.get().raw["error"] == "address_refused"


@pytest.mark.django_db
def test_an_mcp_provider_without_an_evidence_tool_goes_to_an_operator_after_its_budget(
    flow: Any,
) -> None:
    from recovery.models import Evidence
    from tests.support.flow import lookup_due

    _provider_mcp("", lookup_budget=2)
    _crashed(flow)
    assert flow.resume_looked_up()["state"] == "unknown"
    lookup_due("op-1")
    assert flow.resume_looked_up()["state"] == "reconcile"
    assert set(Evidence.objects.values_list("verdict", flat=True)) == {"unavailable"}
