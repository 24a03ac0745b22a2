"""Webhook endpoints: their configuration, the checks on their URLs, their secrets.

endpoint
    A host's receiver (``WebhookEndpoint``), added by an administrator with the events it
    wants; its ``whsec_…`` secret is shown once. A rotation keeps the old secret signing
    beside the new one for a grace period. Every change is audited
    (``webhook_configured``), the URL redacted and fingerprinted.
address check
    A URL must be http(s) with a host that resolves only to public addresses
    (``webhook_url_addresses``, judged by ``common.outbound.address_refused``): checked
    when an endpoint is added and again before every delivery, as DNS changes.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import socket
import urllib.parse
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.errors import ErrorCode
from common.outbound import address_refused
from recovery.models import Host
from recovery.services.errors import Invalid, NotFound
from webhooks.models import WebhookEndpoint, WebhookEvent, webhook_url_redacted

ENABLED = WebhookEndpoint.Status.ENABLED
DISABLED = WebhookEndpoint.Status.DISABLED


def _secret_new() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _events_stored(events: Iterable[str]) -> str:
    chosen = sorted({event.strip() for event in events if event.strip()})
    unknown = [event for event in chosen if event not in WebhookEvent.values]
    if unknown:
        raise Invalid(
            ErrorCode.INVALID_WEBHOOK_EVENTS,
            f"unknown event(s) {', '.join(unknown)}; choose from {', '.join(WebhookEvent.values)}",
        )
    return f",{','.join(chosen)}," if chosen else ""


def endpoint_events(endpoint: WebhookEndpoint) -> list[str]:
    """The events ``endpoint`` receives (every one when it named none)."""
    return [event for event in endpoint.events.split(",") if event] or list(WebhookEvent.values)


def webhook_url_addresses(url: str) -> tuple[urllib.parse.SplitResult, list[str]]:
    """Check ``url`` and resolve its host: the parts and the addresses it may be sent to.

    Refused (``Invalid``) unless http(s) with a host, and unless every address the host
    resolves to is public, or ``SETTLE_WEBHOOKS_ALLOW_PRIVATE`` is on: a URL must never
    point Settle at itself or at a private network (server-side request forgery).
    Called when an endpoint is added and again before every delivery, as DNS changes.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise Invalid(
            ErrorCode.INVALID_WEBHOOK_URL, "a webhook URL must be http:// or https:// with a host"
        )
    if parts.username or parts.password:
        raise Invalid(ErrorCode.INVALID_WEBHOOK_URL, "a webhook URL may not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError) as exc:
        raise Invalid(
            ErrorCode.UNRESOLVABLE_WEBHOOK_URL, f"the webhook URL's host does not resolve: {exc}"
        ) from None
    addresses = sorted({str(info[4][0]) for info in found})
    if not settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE and any(map(address_refused, addresses)):
        raise Invalid(
            ErrorCode.PRIVATE_WEBHOOK_URL,
            f"{parts.hostname} resolves to a loopback, private or reserved address "
            "(set SETTLE_WEBHOOKS_ALLOW_PRIVATE=true to deliver inside your own network)",
        )
    return parts, addresses


def _configured(endpoint: WebhookEndpoint, actor: Actor, change: str, **data: Any) -> None:
    audit_append(
        kind=AuditKind.WEBHOOK_CONFIGURED,
        actor=actor,
        data={
            "endpoint_id": endpoint.pk,
            "host": endpoint.host.name,
            # The path and query may carry a token: the log names where, and fingerprints
            # the whole URL so that a change of it shows.
            "url": webhook_url_redacted(endpoint.url),
            "url_sha256": hashlib.sha256(endpoint.url.encode()).hexdigest(),
            "change": change,
            **data,
        },
    )


@audit_transaction()
def webhook_endpoint_add(
    *, host_name: str, url: str, events: Sequence[str] = (), actor: Actor
) -> tuple[WebhookEndpoint, str]:
    """Add an endpoint for ``host_name``; the endpoint and its secret (shown this once)."""
    host = Host.objects.filter(name=host_name).first()
    if host is None:
        raise NotFound(ErrorCode.UNKNOWN_HOST, f"no host named {host_name!r}")
    if len(url) > 500:
        raise Invalid(ErrorCode.INVALID_WEBHOOK_URL, "a webhook URL is at most 500 characters")
    webhook_url_addresses(url)
    secret = _secret_new()
    endpoint = WebhookEndpoint.objects.create(
        host=host, url=url, events=_events_stored(events), secret=secret
    )
    _configured(endpoint, actor, "added", events=endpoint_events(endpoint))
    return endpoint, secret


def _endpoint_locked(endpoint_id: int) -> WebhookEndpoint:
    endpoint = (
        WebhookEndpoint.objects.select_for_update().select_related("host").filter(pk=endpoint_id)
    ).first()
    if endpoint is None:
        raise NotFound(ErrorCode.UNKNOWN_WEBHOOK_ENDPOINT, f"no webhook endpoint {endpoint_id}")
    return endpoint


@audit_transaction()
def webhook_endpoint_rotate(
    *, endpoint_id: int, actor: Actor, grace: timedelta | None = None
) -> str:
    """A new secret (returned, shown once); the old one keeps signing for ``grace``."""
    endpoint = _endpoint_locked(endpoint_id)
    if grace is None:
        grace = timedelta(hours=settings.SETTLE_WEBHOOK_ROTATION_GRACE_HOURS)
    secret = _secret_new()
    endpoint.previous_secret, endpoint.secret = endpoint.secret, secret
    endpoint.previous_secret_expires_at = timezone.now() + grace
    endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_expires_at"])
    expires = endpoint.previous_secret_expires_at.isoformat()
    _configured(endpoint, actor, "rotated", previous_expires_at=expires)
    return secret


@audit_transaction()
def webhook_endpoint_disable(
    *, endpoint_id: int, actor: Actor, reason: str = "", disabled: bool = True
) -> WebhookEndpoint:
    """Disable an endpoint (its pending messages wait), or enable it again."""
    endpoint = _endpoint_locked(endpoint_id)
    endpoint.status = DISABLED if disabled else ENABLED
    endpoint.disabled_reason = reason[:200] if disabled else ""
    endpoint.failures = 0
    endpoint.save(update_fields=["status", "disabled_reason", "failures"])
    _configured(endpoint, actor, "disabled" if disabled else "enabled", reason=reason)
    return endpoint


def endpoint_signers(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The secrets that sign now: the current one, and the previous one in its grace."""
    signers = [endpoint.secret]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and expires > now:
        signers.append(endpoint.previous_secret)
    return signers
