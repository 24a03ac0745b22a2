"""The HMAC-signed HTTP adapter: ``GET {url}/effects/{key}``, trusted only when signed.

The request goes through ``common.outbound`` (a hard deadline of the provider's
``timeout_seconds`` for the whole exchange, no redirects, the body capped); the signature
check of the answer is this adapter's own. A provider's URL is set by an administrator
and may be a private address, so no address check applies, as it never has.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ssl
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from common.canonical import CanonicalError, strict_loads
from common.outbound import Body, body_read, outbound_client, outbound_exchange, target_direct
from recovery.adapters.base import (
    ABSENT,
    MAX_RECORD_BYTES,
    SIGNATURE_HEADER,
    LookupResult,
    ProviderConfig,
    corrupt,
    digest_verdict,
    record_problem,
    snippet,
    unavailable,
    verdict_result,
)

# Requests in flight at once to one HTTP provider, for a batch of lookups.
HTTP_CONCURRENCY = 8
# What the request asks for: JSON, and the body exactly as signed (never compressed).
_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}


def signature_valid(*, secret: str, body: bytes, signature: str) -> bool:
    """True when ``signature`` is the hex HMAC-SHA256 of ``body`` under ``secret``.

    Shared by lookups and signed callbacks. Compared as bytes, so any text a client
    sends is simply wrong rather than an error.
    """
    if not secret or not signature:
        return False
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    given = signature.strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected.encode("ascii"), given)


@functools.cache
def _trusted() -> ssl.SSLContext:
    """The system's certificates, as the standard library trusts them: a provider inside
    the network may present a certificate of the organisation's own authority. Made once:
    loading them takes longer than a lookup on the local network."""
    return ssl.create_default_context()


def _client() -> httpx.Client:
    return outbound_client(max_connections=HTTP_CONCURRENCY, ssl_context=_trusted())


def http_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    """``GET {url}/effects/{key}``; the body only counts when its HMAC signature verifies."""
    with _client() as client:
        return _http_lookup(client, config, operation_key, expected)


def http_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """One ``GET`` per key, at most ``HTTP_CONCURRENCY`` at a time."""
    workers = min(HTTP_CONCURRENCY, len(wanted))
    with (
        _client() as client,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lookup") as pool,
    ):
        futures = {
            key: pool.submit(_http_lookup, client, config, key, expected)
            for key, expected in wanted.items()
        }
    return {key: future.result() for key, future in futures.items()}


def _unreached(exc: Exception, url: str) -> LookupResult:
    return unavailable(
        f"The provider could not be reached ({type(exc).__name__}: {exc}).",
        error=f"{type(exc).__name__}: {exc}",
        url=url,
    )


def _cut_short(response: httpx.Response, body: Body) -> bool:
    """Whether a body of a stated length ended early, with the connection.

    The bytes that came are judged as the answer, as they always were: their signature
    covers the whole body, so a cut one is ``corrupt`` unless what came is all it signed.
    A chunked body broken off, a reset or the deadline leave nothing to judge.
    """
    chunked = "chunked" in response.headers.get("transfer-encoding", "").lower()
    return (
        isinstance(body.broken, httpx.RemoteProtocolError)
        and "content-length" in response.headers
        and not chunked
    )


def _http_lookup(
    client: httpx.Client, config: ProviderConfig, operation_key: str, expected: str
) -> LookupResult:
    if not config.url:
        return unavailable("No URL is configured for this provider.", error="no_url")
    if not config.secret:
        return unavailable(
            "No signing secret is configured, so no provider answer could be verified.",
            error="no_secret",
        )
    url = f"{config.url.rstrip('/')}/effects/{urllib.parse.quote(operation_key, safe='')}"
    try:
        with outbound_exchange(
            client, "GET", target_direct(url), seconds=config.timeout_seconds, headers=_HEADERS
        ) as response:
            status_code = response.status_code
            # The first of repeated headers, as the standard library's reading took it.
            signature = next(iter(response.headers.get_list(SIGNATURE_HEADER)), None)
            body = body_read(response, MAX_RECORD_BYTES) if status_code == 200 else Body(b"")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return _unreached(exc, url)
    if body.broken is not None and not _cut_short(response, body):
        return _unreached(body.broken, url)
    if status_code == 404:
        return verdict_result(
            ABSENT, "The provider answered 404: it has no effect for this key.", {}
        )
    if status_code != 200:
        return unavailable(
            f"The provider answered HTTP {status_code}, which is not an answer about this key.",
            error=f"http_{status_code}",
            status=status_code,
        )
    return _http_verdict(config.secret, operation_key, expected, signature, body.data)


def _http_verdict(
    secret: str, operation_key: str, expected: str, signature: str | None, body: bytes
) -> LookupResult:
    text = body.decode("utf-8", "replace")
    raw: dict[str, Any] = {"body": snippet(text)}
    if len(body) > MAX_RECORD_BYTES:
        return corrupt(f"The provider's answer is larger than {MAX_RECORD_BYTES} bytes.", raw)
    if signature is None:
        return corrupt(f"The provider's answer carries no {SIGNATURE_HEADER} header.", raw)
    if not signature_valid(secret=secret, body=body, signature=signature):
        return corrupt("The provider's answer has a wrong signature.", raw)
    try:
        record = strict_loads(body)
    except CanonicalError as exc:
        return corrupt(f"The provider's signed answer is not valid JSON ({exc.message}).", raw)
    if not isinstance(record, dict):
        return corrupt("The provider's signed answer is not a JSON object.", raw)
    raw = {"record": record}
    if record.get("operation_key") != operation_key:
        return corrupt(
            f"The provider answered about operation key {record.get('operation_key')!r}, "
            "not the one asked for.",
            raw,
        )
    problem = record_problem(record, "provider's effect record")
    if problem is not None:
        return corrupt(problem, raw)
    return digest_verdict(record, expected, raw, "provider's effect record")
