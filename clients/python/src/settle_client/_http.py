"""One HTTP exchange with Settle: JSON in, JSON or a typed exception out.

Connections are reused (one ``httpx`` client per ``Host``). A call marked ``retry`` is
sent again when the connection failed (refused, reset, closed before the answer), at
most ``retries`` times with a short backoff; nothing else is retried: an error answer is
an answer, and a timeout may mean the request was applied. A dispatch is never marked
``retry``: its lost answer is settled by resume.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import time
from typing import Any

import httpx

from settle_client import errors
from settle_client._protocol import Call

# Failures where the connection broke: the request was not answered, and sending an
# idempotent one again is safe.
CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
BACKOFF_SECONDS = 0.05


class _NoCookies(http.cookiejar.CookieJar):
    """Keeps no cookies: the API authenticates by bearer token, never by a cookie.

    ``httpx.Client`` reads every response's ``Set-Cookie`` into its jar and writes the jar
    into every request; the API sets none, so this is only time spent (and a cookie a
    proxy or a misconfigured server set would otherwise be sent back with the token).
    """

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None


def _client_options(base_url: str, token: str, timeout: float) -> dict[str, Any]:
    """What both clients are built with: the headers every request carries, set once."""
    headers = {"Accept": "application/json"}
    if token:  # a provider's callbacks are signed instead
        headers["Authorization"] = f"Bearer {token}"
    return {"base_url": base_url, "timeout": timeout, "headers": headers, "cookies": _NoCookies()}


def _request(client: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
    """The request for ``call``, built once and sent again as is on a retry."""
    if call.body is None:
        return client.build_request(call.method, call.path)
    content = json.dumps(call.body, separators=(",", ":"), allow_nan=False)
    return client.build_request(call.method, call.path, content=content, headers=_JSON)


_JSON = {"Content-Type": "application/json"}


def _answer(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if response.status_code >= 500:
            raise errors.ServerError(
                f"HTTP {response.status_code} without a JSON body", status=response.status_code
            )
        raise errors.ProtocolError(f"HTTP {response.status_code} with a body that is not JSON")
    if response.is_success:
        return body
    raise errors.api_error(response.status_code, body)


def _rate_limited_wait(response: httpx.Response) -> float | None:
    """Seconds to wait before sending a rate-limited request again (nothing of it was
    done, so any call may be), or None for any other answer."""
    if response.status_code != 429:
        return None
    retry_after = response.headers.get("Retry-After", "")
    return min(float(retry_after), 60.0) if retry_after.isdigit() else 1.0


def _transport_error(call: Call, exc: Exception) -> errors.TransportError:
    return errors.TransportError(
        f"{call.method} {call.path}: {type(exc).__name__}: {exc}", cause=type(exc).__name__
    )


class SyncTransport:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float,
        retries: int,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.client = httpx.Client(**_client_options(base_url, token, timeout), transport=transport)

    def call(self, call: Call) -> dict[str, Any]:
        request = _request(self.client, call)
        attempt = 0
        while True:
            try:
                response = self.client.send(request)
            except CONNECTION_ERRORS as exc:
                if not call.retry or attempt >= self.retries:
                    raise _transport_error(call, exc) from exc
                time.sleep(BACKOFF_SECONDS * 2**attempt)
                attempt += 1
                continue
            except httpx.HTTPError as exc:
                raise _transport_error(call, exc) from exc
            wait = _rate_limited_wait(response)
            if wait is not None and attempt < self.retries:
                time.sleep(wait)
                attempt += 1
                continue
            return _answer(response)

    def close(self) -> None:
        self.client.close()


class AsyncTransport:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float,
        retries: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.client = httpx.AsyncClient(
            **_client_options(base_url, token, timeout), transport=transport
        )

    async def call(self, call: Call) -> dict[str, Any]:
        request = _request(self.client, call)
        attempt = 0
        while True:
            try:
                response = await self.client.send(request)
            except CONNECTION_ERRORS as exc:
                if not call.retry or attempt >= self.retries:
                    raise _transport_error(call, exc) from exc
                await asyncio.sleep(BACKOFF_SECONDS * 2**attempt)
                attempt += 1
                continue
            except httpx.HTTPError as exc:
                raise _transport_error(call, exc) from exc
            wait = _rate_limited_wait(response)
            if wait is not None and attempt < self.retries:
                await asyncio.sleep(wait)
                attempt += 1
                continue
            return _answer(response)

    async def aclose(self) -> None:
        await self.client.aclose()
