"""Providers: sign what Settle verifies, the way it verifies it.

Settle checks ``X-Provider-Signature``: the hex HMAC-SHA256 of the exact body bytes under
the provider's secret. The same header signs a provider's signed callbacks (``Callbacks``)
and the effect records an HTTP provider serves to Settle's lookups (``signed``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Literal
from urllib.parse import quote

import httpx

from settle_client._http import SyncTransport, _answer
from settle_client.errors import TransportError

SIGNATURE_HEADER = "X-Provider-Signature"


def signature(secret: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``body`` under ``secret``."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def signed(secret: str, record: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """``(body, headers)`` for a JSON answer Settle will accept as the provider's."""
    body = json.dumps(record, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return body, {"Content-Type": "application/json", SIGNATURE_HEADER: signature(secret, body)}


class Callbacks:
    """Send a provider's signed notifications about its effects to Settle."""

    def __init__(
        self,
        base_url: str,
        provider: str,
        secret: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.path = f"/api/v1/providers/{quote(provider, safe='')}/callbacks"
        self.secret = secret
        self.http = SyncTransport(base_url, "", timeout=timeout, retries=0, transport=transport)

    def notify(
        self,
        *,
        operation_key: str,
        status: Literal["committed", "failed"],
        params_digest: str,
        reference: str,
        sequence: int,
    ) -> dict[str, Any]:
        """``{applied, state, reason?}``: a stale one (sequence, settled) is not applied.

        ``sequence`` orders the provider's notifications about one operation: Settle
        applies only one newer than the last it applied.
        """
        body, headers = signed(
            self.secret,
            {
                "operation_key": operation_key,
                "status": status,
                "params_digest": params_digest,
                "reference": reference,
                "sequence": sequence,
            },
        )
        try:
            response = self.http.client.post(self.path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(f"POST {self.path}: {type(exc).__name__}: {exc}") from exc
        return _answer(response)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Callbacks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
