"""One message's exchange with its receiver: signed, pinned to the address checked,
and ended by a hard deadline.

signing
    Per the Standard Webhooks specification (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``): the same ``webhook-id`` on every attempt, every signer's
    signature while a rotation's grace lasts.
deadline
    Each exchange (connect, TLS, request, status and headers, body) ends
    ``SETTLE_WEBHOOK_TIMEOUT_SECONDS`` after it began, however the receiver spaces its
    bytes (``common.outbound``, which every outbound request goes through).
    Redirects are never followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import httpx
from django.conf import settings
from django.utils import timezone
from standardwebhooks import Webhook

from common.outbound import (
    Target,
    body_read,
    outbound_client,
    outbound_exchange,
    target_pinned,
)
from recovery.services.errors import Invalid
from webhooks.endpoints import webhook_url_addresses

# A delivery task's sends under way at once; its client keeps connections for them.
DELIVERY_THREADS = 8
# A receiver's answer body is read (and dropped) up to this much, so that its connection
# can serve the next message; beyond it the connection is closed instead.
BODY_LIMIT = 65536


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


def webhook_target(url: str) -> Target | Invalid:
    """Resolve and check ``url`` now (``webhook_url_addresses``): once per URL per batch.

    The request goes to the address checked, so a DNS change between the check and the
    connection cannot point it elsewhere.
    """
    try:
        parts, addresses = webhook_url_addresses(url)
    except Invalid as exc:
        return exc
    return target_pinned(parts, addresses[0])


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
    try:
        with outbound_exchange(
            client,
            "POST",
            target,
            seconds=float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS),
            headers=headers,
            content=claimed.payload.encode(),
        ) as response:
            status = response.status_code
            # The answer is in: a body that stalls or breaks off changes nothing of it.
            body_read(response, BODY_LIMIT)  # as it arrives, until the deadline
    except httpx.TimeoutException as exc:
        return Outcome(claimed, None, f"{type(exc).__name__}: {exc}"[:300], timed_out=True)
    except httpx.HTTPError as exc:
        return Outcome(claimed, None, f"{type(exc).__name__}: {exc}"[:300])
    return Outcome(claimed, status)


def webhook_client() -> httpx.Client:
    return outbound_client(max_connections=DELIVERY_THREADS * 2)
