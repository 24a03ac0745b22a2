"""The outbox: what a change of an operation writes for the hosts to be told.

outbox
    ``WebhookMessage`` rows, written by ``webhook_events_record`` in the transaction of
    the change they report (one INSERT … SELECT, for the enabled endpoints of the
    operation's host subscribed to the event): a rollback leaves none, a crash after the
    commit leaves them to be sent.
change
    The core hands each batch of changes (``recovery.changes``) to
    ``outbox_changes_record``, registered by ``WebhooksConfig.ready``: a transition to a
    state hosts hear of, an approval decided, a stranded receipt completed, each becomes
    an event (``change_event``), as does an approval opened for a host's customer
    (``approval.opened``, with its link); any other change writes nothing.
nudge
    A commit that wrote messages publishes a delivery task at once
    (``webhooks_nudge``); beat's round delivers anyway.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.chain import (
    audit_transaction_last,
    audit_transaction_open,
    audit_transaction_rider,
    audit_transaction_rides,
)
from common.links import approval_link_url
from dbsql import columns
from dbsql.cursor import kept_cursor
from recovery.changes import APPROVAL_OPENED, RECEIPT_COMPLETE, OperationChange
from recovery.models import Operation, State
from webhooks.models import WebhookEndpoint, WebhookEvent, WebhookMessage

logger = logging.getLogger(__name__)

DISABLED = WebhookEndpoint.Status.DISABLED
PENDING = WebhookMessage.Status.PENDING
# The transition data a payload may carry: references, never a token or a secret.
PAYLOAD_KEYS = ("reason", "evidence_id", "request_id", "verdict", "approval_id")
# What a customer's part in a decision adds (``recovery.services.customers``): who, how
# ("link" or "passkey") and when they decided.
PARTY_KEYS = ("party", "party_decision", "method", "decided_at")


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
    decision = {"approve": "approved", "deny": "denied"}.get(event)
    if decision is not None or event == "expire":
        extra |= {key: value for key, value in (data or {}).items() if key in PARTY_KEYS}
    # An approval that expired undecided (``approval_expiry``) is its decision too; a
    # permit that expired after its approval is not: its change carries no decision.
    if event == "expire" and (data or {}).get("decision") == "expired":
        decision = "expired"
    if decision is not None:
        kind = WebhookEvent.APPROVAL_DECIDED
        extra["decision"] = decision
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
    if change.event == APPROVAL_OPENED:
        return OutboxEvent(change.operation, WebhookEvent.APPROVAL_OPENED, dict(change.data))
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


def payload_sent(payload: str) -> str:
    """The body a stored payload is sent as: ``approval.opened`` gets its customer's link
    here, so that the link is never kept in a table (``common.links``)."""
    if '"type":"approval.opened"' not in payload:
        return payload
    body = json.loads(payload)
    body["data"]["link"] = approval_link_url(body["data"]["approval_id"])
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def webhook_events_record(events: Sequence[OutboxEvent]) -> None:
    """Write the outbox rows for ``events`` in the caller's transaction.

    One INSERT … SELECT for the batch: a row for each enabled (or failing) endpoint of
    the operation's host subscribed to the event, none when there is none. A row behind
    a pending one of its (endpoint, operation) waits (``next_attempt_at`` null) until
    that one is done. Each row's ``msg_id`` is the event's own id and its endpoint's. A
    commit that wrote any nudges a delivery at once; beat delivers anyway.

    Inside an ``audit_transaction`` the INSERT rides with the transaction's events
    (``audit_transaction_rider``: in their statement on PostgreSQL, no round trip of its
    own), unless a row of the same operation already rides, which it must see: then it
    runs after the events.
    """
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
    riding = audit_transaction_open()
    for batch in rounds:
        keys = {("webhooks.outbox", item.operation.pk) for item in batch}
        if not riding:
            _outbox_write(batch)
        elif not any(audit_transaction_rides(key) for key in keys):
            audit_transaction_rider(_outbox_sql(batch), keys=keys, counted=_written)
        else:
            audit_transaction_last(partial(_outbox_write, batch))


def _outbox_write(batch: list[OutboxEvent]) -> None:
    _written(_outbox_insert(batch))


def _written(count: int) -> None:
    if count > 0:
        transaction.on_commit(webhooks_nudge)


def _outbox_insert(events: list[OutboxEvent]) -> int:
    sql, params = _outbox_sql(events)
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def _outbox_sql(events: list[OutboxEvent]) -> tuple[str, list[Any]]:
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
    stamp = columns.prep(WebhookMessage, "created_at", now)
    return sql, [stamp, PENDING, stamp, PENDING, *params, DISABLED]


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
            "webhooks.tasks.webhooks_deliver",
            kwargs={"promote": False},
            queue=settings.SETTLE_WEBHOOK_QUEUE,
        )
    except Exception as exc:  # the broker's errors vary by transport
        logger.warning("publishing a webhook delivery failed: %r", exc)
