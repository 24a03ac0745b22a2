"""The HTTP adapter's exchange with its provider, as the provider's socket sees it.

Raw-socket providers answer exactly the bytes each test names, so what is checked is the
exchange itself: the request sent, the deadline over the whole answer, redirects, the body
cap, and a body taken as sent (signed bytes, never decoded).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.providers import digest_of
from recovery.adapters import MAX_RECORD_BYTES, LookupResult, ProviderConfig, evidence_lookup
from recovery.models import Verdict
from tests.support.webhook_receiver import trickling_serve

DIGEST = digest_of({"amount": 1250, "currency": "EUR", "to": "acct-42"})
KEY = "op-1"
SECRET = "provider-test-secret"


def _record(key: str = KEY) -> bytes:
    record = {
        "operation_key": key,
        "params_digest": DIGEST,
        "reference": "h-1",
        "status": "committed",
    }
    return json.dumps(record).encode()


def _signed(body: bytes) -> str:
    return hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def _answer(body: bytes, *head: str, status: str = "200 OK", length: int | None = None) -> bytes:
    lines = [
        f"HTTP/1.1 {status}",
        *head,
        f"Content-Length: {len(body) if length is None else length}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextlib.contextmanager
def _provider(*answers: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """A provider answering its n-th connection with ``answers[n]`` (the last one again
    after), then closing it. Yields its URL and the requests' head bytes as received."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the provider stopped
                return
            with connection:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                received.append(head)
                with contextlib.suppress(OSError):
                    connection.sendall(answers[min(len(received), len(answers)) - 1])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/base", received
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)


def _lookup(url: str, key: str = KEY, **overrides: Any) -> LookupResult:
    config = ProviderConfig(adapter="http", url=url, secret=SECRET, **overrides)
    return evidence_lookup(config=config, operation_key=key, params_digest=DIGEST)


@pytest.mark.parametrize("head", [False, True], ids=["body", "headers"])
def test_a_provider_that_trickles_its_answer_is_cut_at_its_timeout_as_a_whole(
    head: bool,
) -> None:
    # A byte a second: every read is well within the 2 s timeout, so only a bound on the
    # whole exchange ends the lookup (a timeout per read would wait for ever).
    results: list[LookupResult] = []
    with trickling_serve(every=1.0, head=head) as url:
        lookup = threading.Thread(
            target=lambda: results.append(_lookup(url, timeout_seconds=2.0)), daemon=True
        )
        began = time.monotonic()
        lookup.start()
        lookup.join(timeout=10)  # bounded: without the deadline the lookup never ends
        took = time.monotonic() - began
    assert results, f"the lookup was still reading the trickling answer after {took:.1f} s"
    (result,) = results
    assert result.verdict == Verdict.UNAVAILABLE, result
    assert 1.5 <= took < 3.5, took


def test_the_provider_is_asked_for_json_by_get_with_the_key_quoted() -> None:
    key = "op 1/../?x=1#frag&ü"
    body = _record(key)
    with _provider(_answer(body, f"X-Provider-Signature: {_signed(body)}")) as (url, received):
        assert _lookup(url, key).verdict == Verdict.MATCH
    (request,) = received
    line, *headers = request.decode().split("\r\n")
    assert line == "GET /base/effects/op%201%2F..%2F%3Fx%3D1%23frag%26%C3%BC HTTP/1.1"
    fields = {name.lower(): value for name, _, value in (h.partition(": ") for h in headers if h)}
    assert fields["accept"] == "application/json"
    assert fields["accept-encoding"] == "identity"


def test_a_redirect_is_not_followed_and_says_nothing_about_the_key() -> None:
    body = _record()
    signed = _answer(body, f"X-Provider-Signature: {_signed(body)}")
    moved = _answer(b"", "Location: /elsewhere", status="302 Found")
    with _provider(moved, signed) as (url, received):
        result = _lookup(url)
    assert result.verdict == Verdict.UNAVAILABLE
    assert result.raw == {"error": "http_302", "status": 302}
    assert len(received) == 1


def test_an_answer_larger_than_the_cap_is_corrupt() -> None:
    body = b" " * MAX_RECORD_BYTES + _record()
    with _provider(_answer(body, f"X-Provider-Signature: {_signed(body)}")) as (url, _):
        result = _lookup(url)
    assert result.verdict == Verdict.CORRUPT
    assert "larger than" in result.detail


def test_an_answer_cut_short_of_its_length_is_judged_by_what_came() -> None:
    # The signature covers the whole body: the part that came does not verify.
    body = _record() + b" " * 100
    cut = _answer(body[:40], f"X-Provider-Signature: {_signed(body)}", length=len(body))
    with _provider(cut) as (url, _):
        result = _lookup(url)
    assert result.verdict == Verdict.CORRUPT
    assert "wrong signature" in result.detail


def test_a_chunked_answer_broken_off_is_unavailable() -> None:
    body = _record()
    head = f"HTTP/1.1 200 OK\r\nX-Provider-Signature: {_signed(body)}\r\n"
    broken = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"ff\r\n" + body[:40]
    with _provider(broken) as (url, _):
        assert _lookup(url).verdict == Verdict.UNAVAILABLE


def test_the_signature_is_checked_over_the_body_as_sent_never_decoded() -> None:
    # A compressed answer nobody asked for: its signature covers the bytes sent, which
    # verify, and those bytes are not the JSON record.
    body = gzip.compress(_record())
    answer = _answer(body, "Content-Encoding: gzip", f"X-Provider-Signature: {_signed(body)}")
    with _provider(answer) as (url, _):
        result = _lookup(url)
    assert result.verdict == Verdict.CORRUPT
    assert "not valid JSON" in result.detail


def test_the_first_of_repeated_signature_headers_counts() -> None:
    body = _record()
    first, second = f"X-Provider-Signature: {_signed(body)}", "X-Provider-Signature: 00"
    with _provider(_answer(body, first, second)) as (url, _):
        assert _lookup(url).verdict == Verdict.MATCH
    with _provider(_answer(body, second, first)) as (url, _):
        assert _lookup(url).verdict == Verdict.CORRUPT
