"""The client follows the host API's history pages and waits out a 429, without a server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from settle_client import Host, errors
from settle_client import _http as client_http

PAGES = {
    "/api/v1/operations/op-1/history": {
        "permit_id": "p",
        "lines": [{"n": 1}],
        "next": "/api/v1/operations/op-1/history?after=7&limit=100",
    },
    "/api/v1/operations/op-1/history?after=7&limit=100": {
        "permit_id": "p",
        "lines": [{"n": 2}],
        "next": None,
    },
}


def _host(handler: Any, **options: Any) -> Host:
    return Host("http://settle.test", "stt_x", transport=httpx.MockTransport(handler), **options)


def test_operation_history_reads_every_page(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        target = request.url.raw_path.decode()
        return httpx.Response(200, content=json.dumps(PAGES[target]))

    with _host(handler) as host:
        assert host.operation_history("op-1") == [{"n": 1}, {"n": 2}]


def test_a_rate_limited_call_is_sent_again_after_retry_after(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(client_http.time, "sleep", waits.append)
    answers = iter(
        [
            httpx.Response(
                429,
                headers={"Retry-After": "2"},
                json={"error": "rate_limited", "message": "m", "retry_after": 2},
            ),
            httpx.Response(200, json={"key": "op-1"}),
        ]
    )
    with _host(lambda request: next(answers)) as host:
        assert host.operation("op-1") == {"key": "op-1"}
    assert waits == [2.0]


def test_a_call_still_rate_limited_after_its_retries_raises(monkeypatch):
    monkeypatch.setattr(client_http.time, "sleep", lambda seconds: None)
    body = {"error": "rate_limited", "message": "m", "retry_after": 1}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "1"}, json=body)

    with _host(handler, retries=2) as host, pytest.raises(errors.RateLimited) as refused:
        host.operation("op-1")
    assert refused.value.details["retry_after"] == 1
