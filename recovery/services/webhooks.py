"""Webhooks to hosts: endpoints, the transactional outbox, and its delivery.

endpoint
    A host's receiver (``WebhookEndpoint``), added by an administrator with the events it
    wants; its ``whsec_…`` secret is shown once. A rotation keeps the old secret signing
    beside the new one for a grace period.
outbox
    ``WebhookMessage`` rows, written by ``webhook_events_record`` in the transaction of
    the change they report (one INSERT … SELECT, for the enabled endpoints of the
    operation's host subscribed to the event): a rollback leaves none, a crash after the
    commit leaves them to be sent.
change
    The core hands each batch of changes (``recovery.changes``) to
    ``outbox_changes_record``: a transition to a state hosts hear of, an approval
    decided, a stranded receipt completed, each becomes an event (``change_event``); any
    other change writes nothing.
delivery
    Workers claim due messages under a lease (``webhook_messages_claim``), post them
    signed per the Standard Webhooks specification (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``) with no DB lock held, and record each outcome in one place
    (``webhook_outcomes_record``). At least once, in order per (endpoint, operation), the
    same ``webhook-id`` on every attempt; retried with exponential back-off and jitter
    for ``SETTLE_WEBHOOK_RETRY_HOURS``. A receiver answering 410 disables its endpoint.
    Deliveries run on a Celery queue of their own (``SETTLE_WEBHOOK_QUEUE``), so a slow
    receiver holds only the workers of that queue.
deadline
    Each exchange (connect, TLS, request, status and headers, body) ends
    ``SETTLE_WEBHOOK_TIMEOUT_SECONDS`` after it began, however the receiver spaces its
    bytes: every wait on its socket is cut to what is left (``_DeadlineBackend``). The
    outcomes are recorded as they arrive (within ``RECORD_EVERY_SECONDS``, a few in one
    transaction) while the other sends go on, so a slow receiver delays nobody else's
    record, and a message recorded is not sent again. A free thread goes to the endpoint
    with the fewest sends under way.
deferred
    A message of an endpoint that timed out earlier in the same task is not sent: its
    claim is released and it waits as long as its endpoint's errors in a row call for,
    without an attempt counted. A receiver that accepts and never answers costs each
    task one timeout (on at most ``DELIVERY_THREADS`` threads at once), not one per
    message, and the other endpoints' messages go out meanwhile; once it is failing, its
    first success brings everything it was owed forward again.
unsent
    A task starts sends for ``DELIVERY_TASK_SECONDS`` (less if the timeout is long: its
    last deadline falls well inside the task's soft time limit), and none its claim's
    lease would not outlast: such a message's claim is released, due at once, without an
    attempt counted.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import json
import logging
import random
import secrets
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpcore
import httpx
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone
from standardwebhooks import Webhook

from approvals.actors import Actor
from recovery.audit import audit_append, audit_transaction
from recovery.changes import RECEIPT_COMPLETE, OperationChange
from recovery.metrics import WEBHOOK_DELIVERIES
from recovery.models import (
    Host,
    Operation,
    State,
    WebhookEndpoint,
    WebhookEvent,
    WebhookMessage,
)
from recovery.permissions import ProviderPermission
from recovery.selectors.webhooks import webhook_messages_due, webhook_url_redacted
from recovery.services.access import provider_permission_require
from recovery.services.errors import Invalid, NotFound
from recovery.vocabulary import AuditKind

logger = logging.getLogger(__name__)

ENABLED = WebhookEndpoint.Status.ENABLED
FAILING = WebhookEndpoint.Status.FAILING
DISABLED = WebhookEndpoint.Status.DISABLED
PENDING = WebhookMessage.Status.PENDING
DELIVERED = WebhookMessage.Status.DELIVERED
FAILED = WebhookMessage.Status.FAILED

# Back-off: 5 s doubled per attempt up to an hour, each delay jittered by ±25 %.
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 3600.0
BACKOFF_JITTER = 0.25
DELIVERY_THREADS = 8
# A delivery task starts sends for this long at most; each ends by its deadline.
DELIVERY_TASK_SECONDS = 30.0
# What a task keeps of its soft time limit, past its last send's deadline, to record.
RECORD_MARGIN_SECONDS = 15.0
# Outcomes are recorded together once this many arrived or the first waited this long.
RECORD_BATCH = DELIVERY_THREADS * 2
RECORD_EVERY_SECONDS = 0.1
# Writes go out in pieces, each bounded by what is left of the exchange's deadline.
WRITE_CHUNK = 16384
# The transition data a payload may carry: references, never a token or a secret.
PAYLOAD_KEYS = ("reason", "evidence_id", "request_id", "verdict", "approval_id")


# --- Endpoints -------------------------------------------------------------------------


def _secret_new() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def _events_stored(events: Iterable[str]) -> str:
    chosen = sorted({event.strip() for event in events if event.strip()})
    unknown = [event for event in chosen if event not in WebhookEvent.values]
    if unknown:
        raise Invalid(
            "invalid_webhook_events",
            f"unknown event(s) {', '.join(unknown)}; choose from {', '.join(WebhookEvent.values)}",
        )
    return f",{','.join(chosen)}," if chosen else ""


def endpoint_events(endpoint: WebhookEndpoint) -> list[str]:
    """The events ``endpoint`` receives (every one when it named none)."""
    return [event for event in endpoint.events.split(",") if event] or list(WebhookEvent.values)


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


def _address_refused(address: str) -> bool:
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
            "invalid_webhook_url", "a webhook URL must be http:// or https:// with a host"
        )
    if parts.username or parts.password:
        raise Invalid("invalid_webhook_url", "a webhook URL may not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError) as exc:
        raise Invalid(
            "unresolvable_webhook_url", f"the webhook URL's host does not resolve: {exc}"
        ) from None
    addresses = sorted({str(info[4][0]) for info in found})
    if not settings.SETTLE_WEBHOOKS_ALLOW_PRIVATE and any(map(_address_refused, addresses)):
        raise Invalid(
            "private_webhook_url",
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
        raise NotFound("unknown_host", f"no host named {host_name!r}")
    if len(url) > 500:
        raise Invalid("invalid_webhook_url", "a webhook URL is at most 500 characters")
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
        raise NotFound("unknown_webhook_endpoint", f"no webhook endpoint {endpoint_id}")
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


# --- The outbox ------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxEvent:
    """One change to report, for every subscribed endpoint of its operation's host."""

    operation: Operation
    event: str
    data: dict[str, Any]


def transition_event(
    operation: Operation, event: str, target: str, data: dict[str, Any] | None
) -> OutboxEvent | None:
    """The webhook event a transition makes (``operation`` already moved), if any."""
    kind = {
        State.RELEASED: WebhookEvent.RELEASED,
        State.FAILED: WebhookEvent.FAILED,
        State.VOIDED: WebhookEvent.VOIDED,
        State.RECONCILE: WebhookEvent.RECONCILE,
    }.get(State(target))
    extra = {key: value for key, value in (data or {}).items() if key in PAYLOAD_KEYS}
    if event in {"approve", "deny"}:
        kind = WebhookEvent.APPROVAL_DECIDED
        extra["decision"] = "approved" if event == "approve" else "denied"
    if kind is None:
        return None
    extra["event"] = event
    if kind == WebhookEvent.RECONCILE:
        # Why it waits for an operator, in the transition's own words (``WaitReason``).
        extra["reason"] = extra.get("reason") or extra.get("verdict") or event
    if kind == WebhookEvent.RELEASED:
        extra["recovered"] = operation.recovered
    return OutboxEvent(operation, kind, extra)


def receipt_repaired_event(operation: Operation, data: dict[str, Any]) -> OutboxEvent:
    """The webhook event of a stranded receipt completed (``receipt_complete``)."""
    grounds = {key: value for key, value in data.items() if key in PAYLOAD_KEYS}
    return OutboxEvent(
        operation,
        WebhookEvent.RECEIPT_REPAIRED,
        {"receipt_status": data["receipt_status"], "recovered": True, **grounds},
    )


def change_event(change: OperationChange) -> OutboxEvent | None:
    """The webhook event a core change makes, if hosts hear of it."""
    if change.event == RECEIPT_COMPLETE:
        return receipt_repaired_event(change.operation, change.data)
    return transition_event(change.operation, change.event, change.target, change.data)


def outbox_changes_record(changes: Sequence[OperationChange]) -> None:
    """The recorder of core changes (``recovery.changes``): their events' outbox rows."""
    events = [change_event(change) for change in changes]
    webhook_events_record([event for event in events if event is not None])


def _payload(item: OutboxEvent, now: datetime) -> str:
    operation = item.operation
    return json.dumps(
        {
            "type": item.event,
            "timestamp": now.isoformat(),
            "data": {
                "operation": operation.key,
                "state": operation.state,
                "version": operation.version,
                "action": operation.action,
                **item.data,
            },
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def webhook_events_record(events: Sequence[OutboxEvent]) -> int:
    """Write the outbox rows for ``events`` in the caller's transaction; how many.

    One INSERT … SELECT for the batch: a row for each enabled (or failing) endpoint of
    the operation's host subscribed to the event, none when there is none. A row behind
    a pending one of its (endpoint, operation) waits (``next_attempt_at`` null) until
    that one is done. Each row's ``msg_id`` is the event's own id and its endpoint's. A
    commit that wrote any nudges a delivery at once; beat delivers anyway.
    """
    written = 0
    # An operation changes once per statement (each row must see the ones before it);
    # the services never report one twice in a batch, so this is one statement.
    rounds: list[list[OutboxEvent]] = []
    seen: dict[int, int] = {}
    for item in events:
        n = seen.get(item.operation.pk, 0)
        seen[item.operation.pk] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(item)
    for batch in rounds:
        written += _outbox_insert(batch)
    if written > 0:
        transaction.on_commit(webhooks_nudge)
    return written


def _outbox_insert(events: list[OutboxEvent]) -> int:
    now = timezone.now()
    table = WebhookMessage._meta.db_table
    endpoints = WebhookEndpoint._meta.db_table
    selects: list[str] = []
    params: list[Any] = []
    for item in events:
        selects.append(
            "SELECT CAST(%s AS BIGINT) AS operation_id, CAST(%s AS BIGINT) AS host_id, "
            "%s AS event, %s AS payload, %s AS msg_prefix"
        )
        params += [
            item.operation.pk,
            item.operation.host_id,
            item.event,
            _payload(item, now),
            f"msg_{secrets.token_hex(12)}_",
        ]
    sql = (
        f"INSERT INTO {table} (endpoint_id, operation_id, event, payload, msg_id, created_at, "
        "next_attempt_at, attempts, status, last_error) "
        "SELECT e.id, v.operation_id, v.event, v.payload, v.msg_prefix || CAST(e.id AS TEXT), "
        f"%s, CASE WHEN EXISTS (SELECT 1 FROM {table} p WHERE p.endpoint_id = e.id "
        "AND p.operation_id = v.operation_id AND p.status = %s) THEN NULL ELSE %s END, "
        "0, %s, '' "
        f"FROM ({' UNION ALL '.join(selects)}) v JOIN {endpoints} e ON e.host_id = v.host_id "
        "WHERE e.status <> %s AND (e.events = '' OR e.events LIKE '%%,' || v.event || ',%%') "
        "ORDER BY v.operation_id, e.id"
    )
    # As the ORM writes it: SQLite keeps datetimes as text, and a value in another form
    # (with its offset) would compare wrongly with the ORM's "due by now".
    stamp = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(sql, [stamp, PENDING, stamp, PENDING, *params, DISABLED])
        return int(cursor.rowcount)


_last_nudge = 0.0
NUDGE_INTERVAL_SECONDS = 0.1


def webhooks_nudge() -> None:
    """Publish a delivery task now (after a commit that wrote messages), at most ten a
    second per process: beat's round every ``SETTLE_WEBHOOK_SECONDS`` covers the rest.

    A broker that does not take it is logged, never raised: the rows are the record.
    """
    global _last_nudge
    now = time.monotonic()
    if now - _last_nudge < NUDGE_INTERVAL_SECONDS:
        return
    _last_nudge = now
    try:
        current_app.send_task(
            "recovery.tasks.webhooks_deliver",
            kwargs={"promote": False},
            queue=settings.SETTLE_WEBHOOK_QUEUE,
        )
    except Exception as exc:  # the broker's errors vary by transport
        logger.warning("publishing a webhook delivery failed: %r", exc)


# --- Delivery --------------------------------------------------------------------------


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
    the receiver did not answer in time); ``deferred`` or ``unsent``: not sent (see the
    module's docstring)."""

    claimed: Claimed
    status_code: int | None
    error: str = ""
    timed_out: bool = False
    deferred: bool = False
    unsent: bool = False

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def _due(now: datetime) -> QuerySet[WebhookMessage]:
    earlier = WebhookMessage.objects.filter(
        endpoint=OuterRef("endpoint"),
        operation=OuterRef("operation"),
        status=PENDING,
        id__lt=OuterRef("id"),
    )
    return webhook_messages_due(now=now).filter(~Exists(earlier)).order_by("next_attempt_at", "id")


@transaction.atomic
def webhook_messages_claim(*, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` due messages under a lease; each is the first undelivered one
    of its (endpoint, operation), so messages of one operation go out in order.

    ``SKIP LOCKED``: workers claiming at once take different rows; a worker SIGKILLed
    after claiming leaves its claims to lapse at ``lease`` and be delivered again.
    """
    now = timezone.now()
    rows = list(
        _due(now)
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "msg_id", "payload", "endpoint_id", "operation_id", "created_at")[:limit]
    )
    if not rows:
        return []
    lease = now + timedelta(seconds=settings.SETTLE_WEBHOOK_LEASE_SECONDS)
    WebhookMessage.objects.filter(pk__in=[row[0] for row in rows]).update(lease_expires_at=lease)
    endpoints = WebhookEndpoint.objects.in_bulk({row[3] for row in rows})
    return [
        Claimed(
            id=pk,
            msg_id=msg_id,
            payload=payload,
            url=endpoints[endpoint_id].url,
            signers=endpoint_signers(endpoints[endpoint_id], now),
            endpoint_id=endpoint_id,
            operation_id=operation_id,
            created_at=created_at,
            lease=lease,
        )
        for pk, msg_id, payload, endpoint_id, operation_id, created_at in rows
    ]


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


def backoff_seconds(attempts: int) -> float:
    """The wait after the ``attempts``-th failed attempt: doubling, capped, jittered."""
    base = min(BACKOFF_FIRST_SECONDS * 2.0 ** max(attempts - 1, 0), BACKOFF_MAX_SECONDS)
    return base * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)


@transaction.atomic
def webhook_outcomes_record(outcomes: Sequence[Outcome]) -> None:
    """Record what each attempt got; the one place every delivery outcome passes.

    Delivered: done. Otherwise retried after ``backoff_seconds`` until the retry window
    closes (then ``failed``). An endpoint's errors in a row mark it failing; its next
    success clears that and, if it was failing, brings its waiting messages forward;
    410 disables it.
    Deferred (not sent): the claim released, due after its endpoint's back-off. Unsent:
    the claim released, due at once. Only a claim still held is recorded: one that
    lapsed belongs to another worker now.
    """
    now = timezone.now()
    window = timedelta(hours=settings.SETTLE_WEBHOOK_RETRY_HOURS)
    succeeded: set[int] = set()
    failed: dict[int, int] = {}
    gone: set[int] = set()
    by_code: dict[tuple[int, datetime], list[int]] = {}
    done: set[tuple[int, int]] = set()
    tally: dict[str, int] = {}
    deferred: dict[int, list[Claimed]] = {}
    unsent: list[Claimed] = []
    for outcome in outcomes:
        if outcome.unsent:
            tally["unsent"] = tally.get("unsent", 0) + 1
            unsent.append(outcome.claimed)
            continue
        if outcome.deferred:
            tally["deferred"] = tally.get("deferred", 0) + 1
            deferred.setdefault(outcome.claimed.endpoint_id, []).append(outcome.claimed)
            continue
        if outcome.delivered:
            tally["delivered"] = tally.get("delivered", 0) + 1
            key = (int(outcome.status_code or 0), outcome.claimed.lease)
            by_code.setdefault(key, []).append(outcome.claimed.id)
            done.add((outcome.claimed.endpoint_id, outcome.claimed.operation_id))
            succeeded.add(outcome.claimed.endpoint_id)
            continue
        claimed = outcome.claimed
        message = WebhookMessage.objects.filter(
            pk=claimed.id, status=PENDING, lease_expires_at=claimed.lease
        )
        attempts = message.values_list("attempts", flat=True).first()
        if attempts is None:
            continue
        attempts += 1
        given_up = now - claimed.created_at >= window
        message.update(
            attempts=attempts,
            status=FAILED if given_up else PENDING,
            next_attempt_at=now + timedelta(seconds=backoff_seconds(attempts)),
            lease_expires_at=None,
            last_status_code=outcome.status_code,
            last_error=outcome.error or f"HTTP {outcome.status_code}",
            last_attempt_at=now,
        )
        label = "given_up" if given_up else "retrying"
        tally[label] = tally.get(label, 0) + 1
        if given_up:
            done.add((claimed.endpoint_id, claimed.operation_id))
        failed[claimed.endpoint_id] = failed.get(claimed.endpoint_id, 0) + 1
        if outcome.status_code == 410:
            gone.add(claimed.endpoint_id)
    for (code, lease), ids in by_code.items():
        WebhookMessage.objects.filter(pk__in=ids, status=PENDING, lease_expires_at=lease).update(
            attempts=F("attempts") + 1,
            status=DELIVERED,
            delivered_at=now,
            lease_expires_at=None,
            last_status_code=code,
            last_error="",
            last_attempt_at=now,
        )
    _next_promote(done, now)
    _endpoints_update(now, succeeded, failed, gone)
    _deferred_release(now, deferred)
    for lease in {claim.lease for claim in unsent}:
        WebhookMessage.objects.filter(
            pk__in=[claim.id for claim in unsent if claim.lease == lease],
            status=PENDING,
            lease_expires_at=lease,
        ).update(lease_expires_at=None)
    transaction.on_commit(lambda: _deliveries_count(tally))


def _deferred_release(now: datetime, deferred: dict[int, list[Claimed]]) -> None:
    """Release the claims of messages not sent, due again after their endpoint's back-off
    (its errors in a row, counted already): a dead receiver's backlog waits together
    while the messages that timed out probe it on their own back-off."""
    failures = dict(
        WebhookEndpoint.objects.filter(pk__in=list(deferred)).values_list("id", "failures")
    )
    for endpoint_id, claims in deferred.items():
        wait = timedelta(seconds=backoff_seconds(max(failures.get(endpoint_id, 0), 1)))
        for lease in {claim.lease for claim in claims}:
            WebhookMessage.objects.filter(
                pk__in=[claim.id for claim in claims if claim.lease == lease],
                status=PENDING,
                lease_expires_at=lease,
            ).update(
                next_attempt_at=now + wait,
                lease_expires_at=None,
                last_error="not sent: the endpoint timed out earlier in this delivery task",
            )


def _deliveries_count(tally: dict[str, int]) -> None:
    for outcome, count in tally.items():
        WEBHOOK_DELIVERIES.labels(outcome=outcome).inc(count)


def _next_promote(pairs: set[tuple[int, int]], now: datetime) -> None:
    """The next waiting message of each (endpoint, operation) whose head is done is due."""
    if not pairs:
        return
    table = WebhookMessage._meta.db_table
    placeholders = ", ".join(["(%s, %s)"] * len(pairs))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET next_attempt_at = %s WHERE id IN (SELECT MIN(id) FROM {table} "
            "WHERE status = %s AND next_attempt_at IS NULL "
            f"AND (endpoint_id, operation_id) IN ({placeholders}) "
            "GROUP BY endpoint_id, operation_id)",
            [now, PENDING, *(value for pair in sorted(pairs) for value in pair)],
        )


def webhook_waiting_promote() -> int:
    """Make due every waiting message with nothing pending before it; how many.

    A message written while its predecessor was being delivered can miss that
    delivery's promotion (neither transaction saw the other's row); beat's round finds
    it here. Reads only waiting rows.
    """
    earlier = WebhookMessage.objects.filter(
        endpoint=OuterRef("endpoint"),
        operation=OuterRef("operation"),
        status=PENDING,
        id__lt=OuterRef("id"),
    )
    return (
        WebhookMessage.objects.filter(status=PENDING, next_attempt_at__isnull=True)
        .filter(~Exists(earlier))
        .update(next_attempt_at=timezone.now())
    )


def _endpoints_update(
    now: datetime, succeeded: set[int], failed: dict[int, int], gone: set[int]
) -> None:
    for endpoint_id in succeeded - set(failed):
        was_failing = WebhookEndpoint.objects.filter(pk=endpoint_id, status=FAILING).update(
            failures=0, status=ENABLED
        )
        WebhookEndpoint.objects.filter(pk=endpoint_id, failures__gt=0).update(failures=0)
        if was_failing:
            # The receiver is back: what waits for it need not sit out its back-off. Only
            # after an outage (failing): a message refused on its own keeps its back-off
            # while the endpoint's others succeed.
            WebhookMessage.objects.filter(
                endpoint_id=endpoint_id, status=PENDING, next_attempt_at__gt=now
            ).update(next_attempt_at=now)
    for endpoint_id, count in failed.items():
        WebhookEndpoint.objects.filter(pk=endpoint_id).update(failures=F("failures") + count)
        WebhookEndpoint.objects.filter(
            pk=endpoint_id, status=ENABLED, failures__gte=settings.SETTLE_WEBHOOK_FAILING_AFTER
        ).update(status=FAILING)
    if gone:
        WebhookEndpoint.objects.filter(pk__in=gone).update(
            status=DISABLED, disabled_reason="the receiver answered 410 Gone"
        )


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    unsent: int = 0

    def add(self, outcomes: Sequence[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.unsent:
                self.unsent += 1
            elif outcome.deferred:
                self.deferred += 1
            elif outcome.delivered:
                self.delivered += 1
            else:
                self.failed += 1


class _Sends:
    """One delivery task's sends: up to ``DELIVERY_THREADS`` under way, each outcome
    recorded as it arrives, more claimed as threads fall idle, none started after
    ``end`` (``time.monotonic``)."""

    def __init__(
        self, client: httpx.Client, pool: ThreadPoolExecutor, end: float, report: DeliveryReport
    ) -> None:
        self.client = client
        self.pool = pool
        self.end = end
        self.report = report
        self.timeout = float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS)
        self.waiting: list[Claimed] = []
        self.running: dict[Future[Outcome], Claimed] = {}
        self.busy: Counter[int] = Counter()  # endpoint id: its sends under way
        self.timed_out: set[int] = set()  # endpoints sent nothing more in this task
        self.targets: dict[str, Target | Invalid] = {}

    def _held(self) -> list[Outcome]:
        """The waiting messages that will not be sent in this task, taken out. A timed-out
        endpoint's are deferred once none of its sends is under way, so that their wait
        counts every timeout of this task."""
        lease_needed = timezone.now() + timedelta(seconds=self.timeout)
        in_time = time.monotonic() <= self.end
        held: list[Outcome] = []
        keep: list[Claimed] = []
        for item in self.waiting:
            if item.endpoint_id in self.timed_out:
                if self.busy[item.endpoint_id]:
                    keep.append(item)
                else:
                    held.append(Outcome(item, None, deferred=True))
            elif not in_time or item.lease < lease_needed:
                held.append(Outcome(item, None, unsent=True))
            else:
                keep.append(item)
        self.waiting = keep
        return held

    def _startable(self) -> list[Claimed]:
        return [item for item in self.waiting if item.endpoint_id not in self.timed_out]

    def _start(self) -> None:
        startable = self._startable()
        while startable and len(self.running) < DELIVERY_THREADS:
            # The first message of the endpoint with the fewest sends under way: a slow
            # endpoint never takes a thread another endpoint's message is waiting for.
            item = min(startable, key=lambda waiting: self.busy[waiting.endpoint_id])
            startable.remove(item)
            self.waiting.remove(item)
            future = self.pool.submit(self._send, item)
            self.running[future] = item
            self.busy[item.endpoint_id] += 1

    def _send(self, item: Claimed) -> Outcome:
        # Resolved on the delivery thread, once per URL per task: a slow name server
        # holds that thread, never the loop that records the others' outcomes.
        if item.url not in self.targets:
            self.targets[item.url] = webhook_target(item.url)
        return webhook_message_send(item, self.client, self.targets[item.url])

    def _record(self, outcomes: list[Outcome]) -> None:
        if outcomes:
            webhook_outcomes_record(outcomes)
            self.report.add(outcomes)

    def run(self, claimed: list[Claimed]) -> None:
        self.waiting = claimed
        claiming = True  # until a claim finds nothing, and again after each outcome
        arrived: list[Outcome] = []  # not yet recorded
        arrived_since = 0.0

        def flush() -> None:
            self._record(arrived)
            arrived.clear()

        while True:
            held = self._held()
            self._start()
            self._record(held)
            idle = len(self.running) < DELIVERY_THREADS and not self._startable()
            if claiming and idle and time.monotonic() <= self.end:
                flush()  # first: an outcome may make its operation's next message due
                more = webhook_messages_claim(limit=settings.SETTLE_WEBHOOK_BATCH)
                self.waiting += more
                claiming = bool(more)
                if more:
                    continue
            if not self.running:
                flush()
                if self.waiting:  # a timed-out endpoint's, deferred on the next pass
                    continue
                return
            patience = None
            if arrived:
                patience = max(arrived_since + RECORD_EVERY_SECONDS - time.monotonic(), 0.0)
            done, _ = wait(self.running, timeout=patience, return_when=FIRST_COMPLETED)
            for future in done:
                item = self.running.pop(future)
                self.busy[item.endpoint_id] -= 1
                outcome = future.result()
                if outcome.timed_out:
                    self.timed_out.add(item.endpoint_id)
                if not arrived:
                    arrived_since = time.monotonic()
                arrived.append(outcome)
                claiming = True  # the next message of each operation done is due now
            late = arrived and time.monotonic() - arrived_since >= RECORD_EVERY_SECONDS
            if late or len(arrived) >= RECORD_BATCH:
                flush()


def webhooks_deliver(
    *, seconds: float = DELIVERY_TASK_SECONDS, promote: bool = True
) -> DeliveryReport:
    """Claim, send and record until nothing is due; start no send after ``seconds``.

    ``seconds`` is cut so that the last send's deadline falls ``RECORD_MARGIN_SECONDS``
    inside the task's soft time limit: no task of sends ever reaches it. ``promote``:
    first make due what waits behind nothing (``webhook_waiting_promote``); beat's round
    does, a commit's nudge need not.
    """
    report = DeliveryReport()
    if promote:
        webhook_waiting_promote()
    began = time.monotonic()
    soft_limit = float(settings.CELERY_TASK_SOFT_TIME_LIMIT)
    timeout = float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS)
    end = began + min(seconds, soft_limit - RECORD_MARGIN_SECONDS - timeout)
    claimed = webhook_messages_claim(limit=settings.SETTLE_WEBHOOK_BATCH)
    if not claimed:  # beat's usual round: no client, no threads
        return report
    with webhook_client() as client, ThreadPoolExecutor(DELIVERY_THREADS) as pool:
        _Sends(client, pool, end, report).run(claimed)
    return report


# --- Operators -------------------------------------------------------------------------


@audit_transaction()
def webhook_message_redeliver(*, message_id: int, actor: Actor) -> WebhookMessage:
    """Send a message again, with its same ``webhook-id``: due now, its attempts kept.

    Allowed to an operator (``lookup_operations``) of the message's operation's provider;
    a user who may not view that provider is told it does not exist.
    """
    message = (
        WebhookMessage.objects.select_for_update(of=("self",))
        .select_related("operation__provider", "endpoint")
        .filter(pk=message_id)
        .first()
    )
    if message is None:
        raise NotFound("unknown_webhook_message", "no such webhook message")
    provider_permission_require(
        actor=actor,
        provider=message.operation.provider,
        permission=ProviderPermission.LOOKUP_OPERATIONS,
        action="redeliver webhooks of",
        missing="unknown_webhook_message",
    )
    message.status = PENDING
    message.next_attempt_at = timezone.now()
    message.lease_expires_at = None
    message.save(update_fields=["status", "next_attempt_at", "lease_expires_at"])
    audit_append(
        kind=AuditKind.WEBHOOK_REDELIVERED,
        actor=actor,
        data={
            "message_id": message.pk,
            "msg_id": message.msg_id,
            "endpoint_id": message.endpoint_id,
            "operation": message.operation.key,
        },
    )
    transaction.on_commit(webhooks_nudge)
    return message
