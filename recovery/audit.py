"""The append-only, hash-chained audit log.

Every append happens inside the caller's transaction, after locking the chain head, so
an event exists exactly when the change it describes does and the chain never forks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from recovery.canonical import canonical_dumps
from recovery.models import AuditEvent, AuditHead

GENESIS_HASH = "sha256:" + "0" * 64


def _timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_hash(
    *,
    prev_hash: str,
    seq: int,
    at: datetime,
    kind: str,
    operation_key: str,
    actor: str,
    data: dict[str, Any],
) -> str:
    content = canonical_dumps(
        {
            "seq": seq,
            "at": _timestamp(at),
            "kind": kind,
            "operation_key": operation_key,
            "actor": actor,
            "data": data,
        }
    )
    return "sha256:" + hashlib.sha256(prev_hash.encode("ascii") + content).hexdigest()


def audit_append(
    *, kind: str, operation_key: str = "", actor: str = "", data: dict[str, Any] | None = None
) -> AuditEvent:
    """Append one event to the chain; must run inside the transaction of the change."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_append must run inside the transaction it describes")
    data = data or {}
    head, _ = AuditHead.objects.select_for_update().get_or_create(
        pk=1, defaults={"seq": 0, "hash": GENESIS_HASH}
    )
    at = timezone.now()
    seq = head.seq + 1
    digest = event_hash(
        prev_hash=head.hash,
        seq=seq,
        at=at,
        kind=kind,
        operation_key=operation_key,
        actor=actor,
        data=data,
    )
    event = AuditEvent.objects.create(
        seq=seq,
        at=at,
        kind=kind,
        operation_key=operation_key,
        actor=actor,
        data=data,
        prev_hash=head.hash,
        hash=digest,
    )
    AuditHead.objects.filter(pk=1).update(seq=seq, hash=digest)
    return event


@dataclass(frozen=True)
class ChainBreak:
    seq: int
    reason: str


def audit_verify(*, chunk_size: int = 2000) -> Iterator[ChainBreak]:
    """Walk the whole chain in order; yield the first break found (at most one)."""
    expected_prev = GENESIS_HASH
    expected_seq = 1
    events = AuditEvent.objects.order_by("seq").iterator(chunk_size=chunk_size)
    for event in events:
        if event.seq != expected_seq:
            yield ChainBreak(expected_seq, f"event #{expected_seq} is missing")
            return
        if event.prev_hash != expected_prev:
            yield ChainBreak(event.seq, "prev_hash does not match the previous event's hash")
            return
        recomputed = event_hash(
            prev_hash=event.prev_hash,
            seq=event.seq,
            at=event.at,
            kind=event.kind,
            operation_key=event.operation_key,
            actor=event.actor,
            data=event.data,
        )
        if recomputed != event.hash:
            yield ChainBreak(event.seq, "content does not match its hash (edited)")
            return
        expected_prev = event.hash
        expected_seq += 1
    head = AuditHead.objects.filter(pk=1).first()
    last_seq = expected_seq - 1
    if head is not None and (head.seq != last_seq or head.hash != expected_prev):
        yield ChainBreak(last_seq + 1, "the chain head names events that are missing")
    elif head is None and last_seq > 0:
        yield ChainBreak(last_seq, "the chain head is missing")
