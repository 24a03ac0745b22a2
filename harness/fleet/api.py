"""One call to the host API through ``settle_client``, measured and judged.

Every request goes through the client library's own HTTP layer (its JSON, its bearer
token, its typed errors), with nothing retried: a 429, a lost connection or a refusal is
the answer the fleet records. A transport of its own keeps the last response, for the
``X-Settle-SQL`` headers of ``bench/counting_wsgi.py`` and for an answer whose body is not
the JSON object the library expects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import settle_client
from settle_client import errors
from settle_client._protocol import Call

SQL_HEADER = "X-Settle-SQL"
SQL_DETAIL_HEADER = "X-Settle-SQL-Detail"
REQUEST_TIMEOUT = 20.0


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no HTTP answer at all (transport error)
    code: str  # "" for 2xx; the error code, or "malformed" / "transport:<Exception>"
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def outcome(self) -> str:
        """``"200"`` for a success, ``"409:already_consumed"`` for an error."""
        return str(self.status) if self.ok else f"{self.status}:{self.code}"


class _Recording(httpx.HTTPTransport):
    """Keeps the last response and the last failure's exception name."""

    def __init__(self) -> None:
        super().__init__()
        self.last: httpx.Response | None = None
        self.failure = ""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.last, self.failure = None, ""
        try:
            self.last = super().handle_request(request)
        except Exception as exc:
            self.failure = type(exc).__name__
            raise
        return self.last


class Api:
    """The host API through ``settle_client``; every call is recorded and judged."""

    def __init__(self, url: str, host_token: str, approver_token: str) -> None:
        self.url = url
        self.tokens = {"host": host_token, "approver": approver_token}
        self.transport = _Recording()
        options: dict[str, Any] = {"timeout": REQUEST_TIMEOUT, "transport": self.transport}
        self.host = settle_client.Host(url, host_token, retries=0, **options)
        self.approver = settle_client.Approver(url, approver_token, retries=0, **options)
        self.providers: dict[tuple[str, str], settle_client.Callbacks] = {}
        self.calls: list[list[Any]] = []
        self.unexpected: list[dict[str, Any]] = []

    def post(self, path: str, body: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """A host's POST, sent once (``retry=False``: the fleet records every answer)."""
        return lambda: self.host.http.call(Call("POST", path, body, retry=False))

    def callbacks(self, provider: str, secret: str) -> settle_client.Callbacks:
        """The provider's callback sender, signing with ``secret`` (one per pair)."""
        if (provider, secret) not in self.providers:
            self.providers[(provider, secret)] = settle_client.Callbacks(
                self.url, provider, secret, timeout=REQUEST_TIMEOUT, transport=self.transport
            )
        return self.providers[(provider, secret)]

    def call(
        self, endpoint: str, send: Callable[[], dict[str, Any]], *, expect: Iterable[str], key: str
    ) -> Answer:
        """Make one request (``send``); record ``[endpoint, status, code, ms, sql, tx, cpu_ms]``.

        ``expect`` lists the outcomes this call may have here (``Answer.outcome``); any
        other is recorded in ``unexpected``, and a 5xx or transport error always is.
        """
        started = time.perf_counter()
        try:
            body = send()
            answer = Answer(self._status(), "", body)
        except errors.TransportError as exc:
            cause = self.transport.failure or type(exc).__name__
            answer = Answer(0, f"transport:{cause}", {"message": exc.message})
        except errors.SettleError as exc:
            answer = self._refused(exc)
        elapsed_ms = (time.perf_counter() - started) * 1000
        sql, transactions, cpu_ms = self._counted()
        self.calls.append(
            [endpoint, answer.status, answer.code, elapsed_ms, sql, transactions, cpu_ms]
        )
        allowed = set(expect)
        if answer.outcome not in allowed or answer.status >= 500 or answer.status == 0:
            self.unexpected.append(
                {
                    "endpoint": endpoint,
                    "key": key,
                    "outcome": answer.outcome,
                    "expected": sorted(allowed),
                    "body": answer.body,
                    "at": time.time(),
                }
            )
        return answer

    def check(self, answer: Answer, endpoint: str, key: str, **fields: Any) -> None:
        """A 2xx answer whose body lacks one of ``fields`` (name=value) is unexpected too."""
        wrong = {name: answer.body.get(name) for name, value in fields.items()}
        if answer.ok and wrong != fields:
            self.unexpected.append(
                {
                    "endpoint": endpoint,
                    "key": key,
                    "outcome": f"{answer.status} with {wrong}",
                    "expected": [str(fields)],
                    "body": answer.body,
                }
            )

    def _status(self) -> int:
        return self.transport.last.status_code if self.transport.last is not None else 0

    def _refused(self, exc: errors.SettleError) -> Answer:
        """The answer behind a refusal: its status, its code and its body.

        An answer that is not a JSON object (the library's ``ProtocolError``, or a
        ``ServerError`` without a body) is ``malformed``, as is an error code that is not
        a string.
        """
        response = self.transport.last
        status = response.status_code if response is not None else 0
        try:
            body = json.loads(response.content) if response is not None else None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raw = response.content[:300].decode("utf-8", "replace") if response else exc.message
            return Answer(status, "malformed", {"raw": raw})
        if isinstance(exc, errors.ApiError) and isinstance(body.get("error"), str):
            return Answer(exc.status, exc.code, body)
        return Answer(status, "malformed", body)

    def _counted(self) -> tuple[int | None, int | None, float | None]:
        """The statements, transactions and CPU the server counted for this request, if it did."""
        response = self.transport.last
        sql = response.headers.get(SQL_HEADER) if response is not None else None
        if sql is None or response is None:
            return None, None, None
        detail = dict(
            part.partition("=")[::2] for part in response.headers.get(SQL_DETAIL_HEADER, "").split()
        )
        begin, cpu_us = detail.get("begin"), detail.get("cpu_us")
        return (
            int(sql),
            int(begin) if begin is not None else None,
            int(cpu_us) / 1000 if cpu_us is not None else None,
        )
