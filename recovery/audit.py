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
    """Append one event to the chain; must run inside the transaction of the change.

    The head is advanced with a compare-and-set against the head this connection last
    wrote, which costs one UPDATE when nobody else appended in between; otherwise (or
    after a rollback made the remembered head wrong) it locks and re-reads the head.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        raise RuntimeError("audit_append must run inside the transaction it describes")
    data = data or {}
    at = timezone.now()

    def digest_after(seq: int, prev_hash: str) -> str:
        return event_hash(
            prev_hash=prev_hash,
            seq=seq + 1,
            at=at,
            kind=kind,
            operation_key=operation_key,
            actor=actor,
            data=data,
        )

    remembered: tuple[int, str] | None = getattr(connection, "settle_audit_head", None)
    advanced = False
    if remembered is not None:
        seq, prev_hash = remembered
        digest = digest_after(seq, prev_hash)
        advanced = (
            AuditHead.objects.filter(pk=1, seq=seq, hash=prev_hash).update(seq=seq + 1, hash=digest)
            == 1
        )
    if not advanced:
        head, _ = AuditHead.objects.select_for_update().get_or_create(
            pk=1, defaults={"seq": 0, "hash": GENESIS_HASH}
        )
        seq, prev_hash = head.seq, head.hash
        digest = digest_after(seq, prev_hash)
        AuditHead.objects.filter(pk=1).update(seq=seq + 1, hash=digest)
    event = AuditEvent.objects.create(
        seq=seq + 1,
        at=at,
        kind=kind,
        operation_key=operation_key,
        actor=actor,
        data=data,
        prev_hash=prev_hash,
        hash=digest,
    )
    connection.settle_audit_head = (seq + 1, digest)
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
