"""One message's exchange with its receiver: signed, pinned to the address checked,
and ended by a hard deadline.

signing
    Per the Standard Webhooks specification (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``): the same ``webhook-id`` on every attempt, every signer's
    signature while a rotation's grace lasts.
deadline
    Each exchange (connect, TLS, request, status and headers, body) ends
    ``SETTLE_WEBHOOK_TIMEOUT_SECONDS`` after it began, however the receiver spaces its
    bytes: every wait on its socket is cut to what is left (``_DeadlineBackend``).
    Redirects are never followed.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpcore
import httpx
from django.conf import settings
from django.utils import timezone
from standardwebhooks import Webhook

from recovery.services.errors import Invalid
from webhooks.endpoints import webhook_url_addresses

# A delivery task's sends under way at once; its client keeps connections for them.
DELIVERY_THREADS = 8
# Writes go out in pieces, each bounded by what is left of the exchange's deadline.
WRITE_CHUNK = 16384


@dataclass(frozen=True)
class Claimed:
    """A message a worker holds until ``lease``, with what its delivery needs."""

    id: int
    msg_id: str
    payload: str
    url: str
    signers: list[str]
    endpoint_id: int
    operation_id: int
    created_at: datetime
    lease: datetime


@dataclass(frozen=True)
class Outcome:
    """What one attempt got: a status code, or an error before any answer (``timed_out``:
    the receiver did not answer in time); ``deferred`` or ``unsent``: not sent (see
    ``webhooks.delivery``)."""

    claimed: Claimed
    status_code: int | None
    error: str = ""
    timed_out: bool = False
    deferred: bool = False
    unsent: bool = False

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def webhook_headers(claimed: Claimed, now: datetime) -> dict[str, str]:
    """The specification's headers: every signer's signature, space-separated."""
    signature = " ".join(
        Webhook(secret).sign(claimed.msg_id, now, claimed.payload) for secret in claimed.signers
    )
    return {
        "webhook-id": claimed.msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


@dataclass(frozen=True)
class Target:
    """Where a URL's messages go now: its checked address, and the name for Host and TLS."""

    url: str
    host: str
    sni: str


def webhook_target(url: str) -> Target | Invalid:
    """Resolve and check ``url`` now (``webhook_url_addresses``): once per URL per batch.

    The request goes to the address checked, so a DNS change between the check and the
    connection cannot point it elsewhere.
    """
    try:
        parts, addresses = webhook_url_addresses(url)
    except Invalid as exc:
        return exc
    address = addresses[0]
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    pinned = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return Target(pinned, parts.netloc, parts.hostname or "")


# The instant this thread's exchange must end (``time.monotonic``), or None: no exchange.
_exchange = threading.local()


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's exchange; ``error`` once none is."""
    deadline: float | None = getattr(_exchange, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the delivery's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait ends at the running exchange's deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_CHUNK):
            chunk = buffer[start : start + WRITE_CHUNK]
            self._stream.write(chunk, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sockets, each wait cut to the exchange's deadline (``_left``)."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        bounded = _left(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, bounded, local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        raise NotImplementedError("webhooks are delivered over TCP")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on a pool of ``_DeadlineBackend`` connections."""

    def __init__(self, *, limits: httpx.Limits) -> None:
        super().__init__(trust_env=False, limits=limits)
        # httpx takes no network backend (httpcore's pool does): its pool is replaced.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )


def webhook_message_send(
    claimed: Claimed, client: httpx.Client, target: Target | Invalid
) -> Outcome:
    """Post one message to ``target``; never raises. No DB access: a delivery thread runs it.

    The whole exchange ends ``SETTLE_WEBHOOK_TIMEOUT_SECONDS`` after it began (a client
    from ``webhook_client``): an answer without its status by then has timed out. The
    status is all that counts: the body is read only until then (so the connection can
    serve the next message), never waited for. Redirects are never followed: a 3xx is an
    answer like any other that is not 2xx.
    """
    if isinstance(target, Invalid):
        return Outcome(claimed, None, f"{target.code}: {target.message}"[:300])
    headers = webhook_headers(claimed, timezone.now())
    headers["host"] = target.host
    _exchange.deadline = time.monotonic() + float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS)
    try:
        with client.stream(
            "POST",
            target.url,
            content=claimed.payload.encode(),
            headers=headers,
            extensions={"sni_hostname": target.sni},
        ) as response:
            status = response.status_code
            # The answer is in: a body that stalls or breaks off changes nothing of it.
            with contextlib.suppress(httpx.HTTPError):
                for _ in response.iter_raw():  # as it arrives, until the deadline
                    pass
    except httpx.TimeoutException as exc:
        return Outcome(claimed, None, f"{type(exc).__name__}: {exc}"[:300], timed_out=True)
    except httpx.HTTPError as exc:
        return Outcome(claimed, None, f"{type(exc).__name__}: {exc}"[:300])
    finally:
        _exchange.deadline = None
    return Outcome(claimed, status)


def webhook_client() -> httpx.Client:
    return httpx.Client(
        timeout=float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS),
        follow_redirects=False,
        trust_env=False,
        transport=_DeadlineTransport(limits=httpx.Limits(max_connections=DELIVERY_THREADS * 2)),
    )
