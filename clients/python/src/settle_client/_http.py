"""One HTTP exchange with Settle: JSON in, JSON or a typed exception out.

Connections are reused (one ``httpx`` client per ``Host``). A call marked ``retry`` is
sent again when the connection failed (refused, reset, closed before the answer), at
most ``retries`` times with a short backoff; nothing else is retried: an error answer is
an answer, and a timeout may mean the request was applied. A dispatch is never marked
``retry``: its lost answer is settled by resume.
"""

from __future__ import annotations

import asyncio
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


def _request(call: Call, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    request: dict[str, Any] = {"method": call.method, "url": call.path, "headers": headers}
    if call.body is not None:
        headers["Content-Type"] = "application/json"
        request["content"] = json.dumps(call.body, separators=(",", ":"), allow_nan=False)
    return request


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
        self.token = token
        self.retries = retries
        self.client = httpx.Client(base_url=base_url, timeout=timeout, transport=transport)

    def call(self, call: Call) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                response = self.client.request(**_request(call, self.token))
            except CONNECTION_ERRORS as exc:
                if not call.retry or attempt >= self.retries:
                    raise _transport_error(call, exc) from exc
                time.sleep(BACKOFF_SECONDS * 2**attempt)
                attempt += 1
                continue
            except httpx.HTTPError as exc:
                raise _transport_error(call, exc) from exc
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
        self.token = token
        self.retries = retries
        self.client = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport)

    async def call(self, call: Call) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                response = await self.client.request(**_request(call, self.token))
            except CONNECTION_ERRORS as exc:
                if not call.retry or attempt >= self.retries:
                    raise _transport_error(call, exc) from exc
                await asyncio.sleep(BACKOFF_SECONDS * 2**attempt)
                attempt += 1
                continue
            except httpx.HTTPError as exc:
                raise _transport_error(call, exc) from exc
            return _answer(response)

    async def aclose(self) -> None:
        await self.client.aclose()
