"""Outbound HTTP: the one way Settle asks another system over the network.

Provider lookups (``recovery.adapters.http``) and webhook deliveries (``webhooks.send``)
both send through it, and so will whatever else Settle sends (the customer's approval
links): it lives in the bottom layer, which every app may import. The MCP adapter
(``recovery.adapters.mcp``) speaks through the MCP SDK's async client, httpx2, which gets
the same guards from ``outbound_async_client`` (see ``OutboundGuard``).

deadline
    Each exchange (connect, TLS, request, status and headers, body) ends ``seconds`` after
    it began, however the other side spaces its bytes: every wait on its socket is cut to
    what is left (``_DeadlineBackend``). The client's own timeout bounds each connect, read
    and write on top of that.
redirects
    Never followed: a 3xx is an answer like any other.
body cap
    ``body_read`` keeps at most one byte more than the caller's limit, so an answer too
    large to trust shows as such without being read to its end.
address check
    Optional, because the callers differ: a webhook URL is given by a host and must reach
    only public addresses (``address_refused``), and its request goes to the very address
    checked (``target_pinned``), so a DNS change between check and connection cannot point
    it elsewhere. A provider's URL is set by an administrator and may be private: it is
    sent to as written (``target_direct``), resolved at connection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpcore
import httpcore2
import httpx
import httpx2

# Writes go out in pieces, each bounded by what is left of the exchange's deadline.
WRITE_CHUNK = 16384

# Prefixes whose last 32 bits are an IPv4 address that traffic reaches: NAT64's
# well-known prefix (RFC 6052) and the deprecated IPv4-compatible addresses (::a.b.c.d).
_IPV4_IN_LAST_32_BITS = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::/96"))
# NAT64's local-use prefix (RFC 8215): where the IPv4 address sits is each network's own.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def _ipv4_embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a packet to ``ip`` reaches, if ``ip`` is a wrapping of one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in prefix for prefix in _IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_refused(address: str) -> bool:
    """Whether ``address`` is loopback, private, reserved or multicast, or wraps one.

    Python 3.11's ``is_global`` judges an IPv6 address by its own range alone: it calls
    NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48), IPv4-compatible, 6to4 and
    site-local (fec0::/10) addresses global whatever they lead to, so the IPv4 address a
    wrapping carries is judged instead, and the ranges it leaves out are refused here.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL or ip.is_site_local or ip.teredo is not None:
            return True
        ip = _ipv4_embedded(ip) or ip
    return not ip.is_global or ip.is_multicast


@dataclass(frozen=True)
class Target:
    """Where a request goes: its URL, and when pinned, the name for Host and TLS."""

    url: str
    host: str = ""
    sni: str = ""


def target_pinned(parts: urllib.parse.SplitResult, address: str) -> Target:
    """``parts`` sent to ``address`` (already checked), under the URL's own name."""
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    pinned = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return Target(pinned, parts.netloc, parts.hostname or "")


def target_direct(url: str) -> Target:
    """``url`` as written, its host resolved when the connection is made; no check."""
    return Target(url)


# The instant this thread's exchange must end (``time.monotonic``), or None: no exchange.
_exchange = threading.local()


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's exchange; ``error`` once none is."""
    deadline: float | None = getattr(_exchange, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the exchange's deadline passed")
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
        raise NotImplementedError("outbound requests go over TCP")

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport on a pool of ``_DeadlineBackend`` connections."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: Any) -> None:
        super().__init__(trust_env=False, limits=limits)
        # httpx takes no network backend (httpcore's pool does): its pool is replaced.
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )


def outbound_client(*, max_connections: int, ssl_context: Any = None) -> httpx.Client:
    """A client for ``outbound_exchange``: no redirects, no proxy or settings from the
    environment. ``ssl_context``: the certificates trusted, certifi's when None."""
    if ssl_context is None:
        ssl_context = httpx.create_ssl_context(trust_env=False)
    return httpx.Client(
        follow_redirects=False,
        trust_env=False,
        transport=_DeadlineTransport(
            limits=httpx.Limits(max_connections=max_connections), ssl_context=ssl_context
        ),
    )


@contextlib.contextmanager
def outbound_exchange(
    client: httpx.Client,
    method: str,
    target: Target,
    *,
    seconds: float,
    headers: dict[str, str],
    content: bytes = b"",
) -> Iterator[httpx.Response]:
    """One request to ``target``, its answer streamed; it all ends ``seconds`` after now.

    The status and headers are in when this yields; the body is the caller's to read
    (``body_read``) inside the block, under the same deadline. Raises ``httpx.HTTPError``
    (``httpx.TimeoutException`` once the deadline or a timeout passed) or
    ``httpx.InvalidURL``. ``client`` must come from ``outbound_client``.
    """
    headers = dict(headers)
    extensions: dict[str, Any] = {}
    if target.host:
        headers["host"] = target.host
    if target.sni:
        extensions["sni_hostname"] = target.sni
    _exchange.deadline = time.monotonic() + seconds
    try:
        with client.stream(
            method,
            target.url,
            content=content,
            headers=headers,
            timeout=seconds,
            follow_redirects=False,
            extensions=extensions,
        ) as response:
            yield response
    finally:
        _exchange.deadline = None


@dataclass(frozen=True)
class Body:
    """An answer's body as it came on the wire (never decoded), at most one byte more than
    the caller's limit, and what broke it off before its end, if anything."""

    data: bytes
    broken: httpx.HTTPError | None = None


def body_read(response: httpx.Response, limit: int) -> Body:
    """Read the body until its end, ``limit + 1`` bytes, or an error; never raises.

    More than ``limit`` bytes means the body is larger than the caller accepts. The bytes
    that came before an error are kept: whether they count is the caller's decision.
    """
    data = bytearray()
    try:
        for chunk in response.iter_raw():
            data += chunk
            if len(data) > limit:
                break
    except httpx.HTTPError as exc:
        return Body(bytes(data[: limit + 1]), exc)
    return Body(bytes(data[: limit + 1]))


# -- the same guards for an async client (httpx2, the MCP SDK's HTTP library) ---------------


class OutboundGuard:
    """What one async exchange may do, and what it ran into.

    ``refuse_private``: every address a name resolves to is judged by ``address_refused``
    when the connection is made, and the socket goes to the very address judged, so no DNS
    answer between a check and a connection can lead elsewhere. ``byte_cap``: all the bytes
    read over the exchange's connections, headers and framing included; a read past it
    fails. The flags say afterwards why the exchange failed, which the library's own
    exception, raised deep in a task group, no longer does.
    """

    def __init__(self, *, refuse_private: bool, byte_cap: int) -> None:
        self.refuse_private = refuse_private
        self.byte_cap = byte_cap
        self.bytes_read = 0
        self.refused_address = ""
        self.over_cap = False
        self.error_status = 0  # the last HTTP error status answered, if any


class _GuardedStream(httpcore2.AsyncNetworkStream):
    def __init__(self, stream: httpcore2.AsyncNetworkStream, guard: OutboundGuard) -> None:
        self._stream = stream
        self._guard = guard

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._stream.read(max_bytes, timeout)
        self._guard.bytes_read += len(data)
        if self._guard.bytes_read > self._guard.byte_cap:
            self._guard.over_cap = True
            raise httpcore2.ReadError(f"the answer is larger than {self._guard.byte_cap} bytes")
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.AsyncNetworkStream:
        tls = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _GuardedStream(tls, self._guard)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's own sockets, to addresses checked at connection, reads counted."""

    def __init__(self, guard: OutboundGuard) -> None:
        self._backend = httpcore2.AnyIOBackend()
        self._guard = guard

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore2.AsyncNetworkStream:
        address = host
        if self._guard.refuse_private:
            try:
                found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpcore2.ConnectError(f"{host} does not resolve ({exc})") from exc
            addresses = [str(info[4][0]) for info in found]
            refused = next((item for item in addresses if address_refused(item)), None)
            if refused is not None or not addresses:
                self._guard.refused_address = refused or host
                raise httpcore2.ConnectError(f"{host} resolves to the refused address {refused}")
            address = addresses[0]
        stream = await self._backend.connect_tcp(
            address, port, timeout, local_address, socket_options
        )
        return _GuardedStream(stream, self._guard)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore2.AsyncNetworkStream:
        raise NotImplementedError("outbound requests go over TCP")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, *, guard: OutboundGuard, ssl_context: Any) -> None:
        super().__init__(trust_env=False)
        # As for ``_DeadlineTransport``: httpx2 takes no network backend, its pool does.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=4, network_backend=_GuardedBackend(guard)
        )


def outbound_async_client(
    *, guard: OutboundGuard, seconds: float, headers: dict[str, str], ssl_context: Any = None
) -> httpx2.AsyncClient:
    """An httpx2 client under ``guard``: no redirects, no proxy or settings from the
    environment, each connect and read bounded by ``seconds``. The whole exchange's
    deadline is the caller's (``anyio.fail_after``), which cancels whatever is waiting."""
    if ssl_context is None:
        ssl_context = httpx2.create_ssl_context(trust_env=False)

    async def status_seen(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            guard.error_status = response.status_code

    return httpx2.AsyncClient(
        headers=headers,
        event_hooks={"response": [status_seen]},
        timeout=httpx2.Timeout(seconds),
        follow_redirects=False,
        trust_env=False,
        transport=_GuardedTransport(guard=guard, ssl_context=ssl_context),
    )
