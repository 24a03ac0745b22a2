"""Seeding a database with many operations fast, for ``benchmark_console`` and ``benchmark_audit``.

Rows are made in Python and written with ``COPY`` on PostgreSQL (``executemany`` on
SQLite, for the small sizes tests use), with explicit ids so that the tables can point
at each other without reading anything back. Every audit chain is a valid chain: its
hashes are computed here, streamed, with ``audit.hashing.event_hash`` — the
same definition ``verify_audit`` checks.

The shape of N operations (``i`` counts from 0):

- every 20th is stuck, alternately ``unknown`` and ``reconcile`` (5 %), each with a
  running receipt, two lookups with their evidence, an approval and a consumed permit;
- every 2,000th (offset 7) is ``voided`` with its receipt still running: a stranded
  receipt on a settled operation;
- every 50th (offset 3) ``failed``; every 50th (offset 11) ``released`` from matching
  evidence (recovered); the rest ``released`` on their worker's report;
- every 10th (offset 9) belongs to the second, small provider;
- ``updated_at`` rises with ``i`` over the last 30 days.

Audit events: a settled operation has two (registered, its final transition), a stuck
one four or five (registered, dispatched, lease lost, evidence, and for ``reconcile``
the transition that sent it there), so about 2.2 events per operation: fewer than a real
lifecycle writes, enough for the audit trail's pages and for verifying.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.color import no_style
from django.db import connection, models
from django.utils import timezone

from approvals.models import Approval, Permit
from audit.hashing import GENESIS_HASH, _content_hash, timestamp
from audit.models import AuditEvent
from common.actors import Actor
from common.canonical import canonical_dumps, sha256_digest
from recovery.models import Dispatch, Evidence, Host, LookupAttempt, Operation, Provider

PROVIDERS = ("bench-orders", "bench-ledger")
HOST = "bench-host"
SPAN = timedelta(days=30)
_SYSTEM = Actor.system("worker").stored
_HOST_ACTOR_NAME = HOST


def operation_key(i: int) -> str:
    return f"bench-{i:08d}"


def provider_reference(i: int) -> str:
    """The provider's reference of operation ``i``'s evidence (stuck and recovered ones)."""
    return f"PR-{i:08d}"


def kind_of(i: int) -> str:
    """What operation ``i`` is: unknown, reconcile, stranded, failed, recovered, released."""
    if i % 20 == 0:
        return "unknown" if (i // 20) % 2 == 0 else "reconcile"
    if i % 2000 == 7:
        return "stranded"
    if i % 50 == 3:
        return "failed"
    if i % 50 == 11:
        return "recovered"
    return "released"


class Writer:
    """Rows into one table: ``COPY`` on PostgreSQL, ``executemany`` elsewhere."""

    def __init__(self, table: str, columns: Sequence[str]) -> None:
        self.table = table
        self.columns = list(columns)

    def write(self, rows: Iterable[Sequence[Any]]) -> int:
        count = 0
        if connection.vendor == "postgresql":
            connection.ensure_connection()
            raw = connection.connection.cursor()
            names = ", ".join(self.columns)
            with raw.copy(f"COPY {self.table} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
            return count
        marks = ", ".join(["%s"] * len(self.columns))
        sql = f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES ({marks})"
        batch: list[Sequence[Any]] = []
        with connection.cursor() as cursor:
            for row in rows:
                batch.append(row)
                count += 1
                if len(batch) >= 5000:
                    cursor.executemany(sql, batch)
                    batch = []
            if batch:
                cursor.executemany(sql, batch)
        return count


def _db_time(at: datetime) -> Any:
    """A datetime as the backend's cursor takes it (SQLite: naive UTC text)."""
    if connection.vendor == "postgresql":
        return at
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(" ")


def _json(value: Any) -> str:
    return canonical_dumps(value).decode("ascii")


class Chain:
    """One audit chain being written: each event hashed onto the one before."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seq = 0
        self.hash = GENESIS_HASH

    def event(self, at: datetime, kind: str, actor: str, data: dict[str, Any]) -> tuple[Any, ...]:
        self.seq += 1
        prev = self.hash
        self.hash = _content_hash(
            prev,
            {
                "seq": self.seq,
                "at": timestamp(at),
                "kind": kind,
                "operation_key": self.key,
                "actor": actor,
                "data": data,
            },
        )
        return (self.seq, _db_time(at), kind, self.key, actor, _json(data), prev, self.hash)


AUDIT_COLUMNS = ("seq", "at", "kind", "operation_key", "actor", "data", "prev_hash", "hash")


def _transition(event: str, old: str, new: str, version: int, **extra: Any) -> dict[str, Any]:
    return {"event": event, "from": old, "to": new, "version": version, **extra}


def seed_operations(
    n: int, *, first: int = 0, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Insert ``n`` operations shaped as the module says, numbered from ``first`` (a
    second call adds to the first's); what was made, by table."""
    now = timezone.now()
    start = now - SPAN
    step = SPAN / max(n, 1)
    host, _ = Host.objects.get_or_create(
        name=HOST, defaults={"token_hash": "sha256:" + uuid.uuid4().hex * 2}
    )
    host_actor = Actor.of("host", host).stored
    providers = [
        Provider.objects.get_or_create(
            name=name, defaults={"adapter": Provider.Adapter.JOURNAL, "path": "/nonexistent"}
        )[0]
        for name in PROVIDERS
    ]
    first_op = _next_id(Operation)
    first_evidence = _next_id(Evidence)
    first_dispatch = _next_id(Dispatch)

    # Each operation's rows, computed once and handed to the table writers in turn.
    ops: list[tuple[Any, ...]] = []
    dispatches: list[tuple[Any, ...]] = []
    evidence: list[tuple[Any, ...]] = []
    lookups: list[tuple[Any, ...]] = []
    approvals: list[tuple[Any, ...]] = []
    permits: list[tuple[Any, ...]] = []

    def audit_rows() -> Iterator[tuple[Any, ...]]:
        evidence_id = first_evidence
        for i in range(first, first + n):
            kind = kind_of(i)
            key = operation_key(i)
            op_id = first_op + i - first
            provider = providers[1 if i % 10 == 9 else 0]
            updated = start + step * (i - first)
            created = updated - timedelta(minutes=5)
            params = {"amount": i % 10000, "currency": "EUR", "order": key}
            canonical = _json(params)
            digest = sha256_digest(canonical.encode())
            chain = Chain(key)
            yield chain.event(
                created,
                "registered",
                host_actor,
                {"action": "charge", "provider": provider.name, "params_digest": digest},
            )
            dispatched = created + timedelta(seconds=30)
            stuck = kind in ("unknown", "reconcile")
            state = {"recovered": "released", "stranded": "voided"}.get(kind, kind)
            if stuck or kind == "stranded":
                yield chain.event(
                    dispatched,
                    "transition",
                    host_actor,
                    _transition("dispatch", "approved", "dispatched", 3),
                )
                lost = dispatched + timedelta(minutes=1)
                yield chain.event(
                    lost,
                    "transition",
                    _SYSTEM,
                    _transition("lease_lost", "dispatched", "unknown", 4),
                )
                version = 4
                looks = 2 if stuck else 1
                for look in range(looks):
                    seen = lost + timedelta(seconds=30 * (look + 1))
                    verdict = "mismatch" if kind == "reconcile" and look == 1 else "absent"
                    raw: dict[str, Any] = {"status": "none" if verdict == "absent" else "ok"}
                    evidence.append(
                        (
                            evidence_id,
                            op_id,
                            "lookup",
                            verdict,
                            raw["status"],
                            provider_reference(i),
                            "",
                            _json(raw),
                            sha256_digest(canonical_dumps(raw)),
                            _db_time(seen),
                            False,
                        )
                    )
                    lookups.append(
                        (
                            op_id,
                            "task",
                            "finished",
                            _db_time(seen - timedelta(seconds=1)),
                            _db_time(seen + timedelta(seconds=30)),
                            _db_time(seen),
                            evidence_id,
                        )
                    )
                    yield chain.event(
                        seen, "evidence", _SYSTEM, {"evidence": evidence_id, "verdict": verdict}
                    )
                    evidence_id += 1
                if kind == "reconcile":
                    yield chain.event(
                        updated,
                        "transition",
                        _SYSTEM,
                        _transition("escalate", "unknown", "reconcile", 5, verdict="mismatch"),
                    )
                    version = 5
                elif kind == "stranded":
                    yield chain.event(
                        updated,
                        "transition",
                        _SYSTEM,
                        _transition("void", "unknown", "voided", 5),
                    )
                    version = 5
                receipt, receipt_evidence, reference = "running", None, ""
            else:
                final = "released" if state == "released" else "failed"
                receipt_evidence = None
                if kind == "recovered":
                    evidence.append(
                        (
                            evidence_id,
                            op_id,
                            "lookup",
                            "match",
                            "committed",
                            provider_reference(i),
                            "",
                            "{}",
                            sha256_digest(b"{}"),
                            _db_time(updated),
                            False,
                        )
                    )
                    receipt_evidence = evidence_id
                    evidence_id += 1
                yield chain.event(
                    updated,
                    "transition",
                    host_actor if kind != "recovered" else _SYSTEM,
                    _transition(
                        "committed" if final == "released" else "failed", "dispatched", final, 4
                    ),
                )
                version = 4
                receipt = "succeeded" if final == "released" else "failed"
                reference = f"RR-{i:08d}"
            ops.append(
                (
                    op_id,
                    chain.seq,
                    chain.hash,
                    key,
                    host.pk,
                    "charge",
                    provider.pk,
                    canonical,
                    digest,
                    state,
                    version,
                    kind == "recovered",
                    2 if kind == "reconcile" else (1 if stuck else 0),
                    _db_time(updated + timedelta(minutes=1)) if kind == "unknown" else None,
                    None,
                    receipt == "running",
                    _db_time(created),
                    _db_time(updated),
                )
            )
            permit_id = uuid.UUID(int=i + 1)
            dispatches.append(
                (
                    first_dispatch + i - first,
                    op_id,
                    str(permit_id),
                    hashlib.md5(key.encode()).hexdigest(),
                    "worker-1",
                    _db_time(dispatched),
                    _db_time(dispatched + timedelta(seconds=60)),
                    receipt,
                    reference,
                    receipt_evidence is not None,
                    receipt_evidence,
                    None if receipt == "running" else _db_time(updated),
                )
            )
            if stuck:
                approval_id = str(uuid.UUID(int=(1 << 64) + i))
                approvals.append(
                    (
                        approval_id,
                        key,
                        "charge",
                        provider.name,
                        HOST,
                        digest,
                        "approved",
                        host_actor,
                        Actor.system("bench").stored,
                        _db_time(created),
                        _db_time(created + timedelta(seconds=10)),
                    )
                )
                permits.append(
                    (
                        str(permit_id),
                        approval_id,
                        key,
                        "charge",
                        provider.name,
                        digest,
                        "consumed",
                        _db_time(created + timedelta(seconds=10)),
                        _db_time(created + timedelta(hours=1)),
                        _db_time(dispatched),
                        host_actor,
                        None,
                        "",
                        "",
                    )
                )

    made: dict[str, Any] = {}
    progress("audit events (hashing)")
    made["audit_events"] = Writer(AuditEvent._meta.db_table, AUDIT_COLUMNS).write(audit_rows())
    progress("operations")
    made["operations"] = Writer(Operation._meta.db_table, _columns(Operation)).write(ops)
    ops.clear()
    progress("evidence")
    evidence_columns = [
        "id",
        "operation_id",
        "source",
        "verdict",
        "provider_status",
        "provider_reference",
        "detail",
        "raw",
        "raw_digest",
        "captured_at",
        "absent_is_authoritative",
    ]
    made["evidence"] = Writer(Evidence._meta.db_table, evidence_columns).write(evidence)
    progress("dispatches")
    dispatch_columns = [
        "id",
        "operation_id",
        "permit_id",
        "fencing_token",
        "worker",
        "created_at",
        "lease_expires_at",
        "receipt_status",
        "receipt_reference",
        "receipt_recovered",
        "receipt_evidence_id",
        "receipt_reported_at",
    ]
    made["dispatches"] = Writer(Dispatch._meta.db_table, dispatch_columns).write(dispatches)
    dispatches.clear()
    lookup_columns = [
        "operation_id",
        "trigger",
        "status",
        "started_at",
        "lease_expires_at",
        "finished_at",
        "evidence_id",
    ]
    made["lookups"] = Writer(LookupAttempt._meta.db_table, lookup_columns).write(lookups)
    # The columns a policy fills are left as an approval without one has them.
    seeded = _columns(Approval)[: len(approvals[0])] if approvals else _columns(Approval)
    rest, defaults = _defaults(Approval, seeded)
    made["approvals"] = Writer(Approval._meta.db_table, [*seeded, *rest]).write(
        (*row, *defaults) for row in approvals
    )
    made["permits"] = Writer(Permit._meta.db_table, _columns(Permit)).write(permits)
    _sequences_reset()
    progress("analyze")
    analyze()
    return made


def seed_audit(n: int, *, chain_length: int = 4) -> int:
    """``n`` audit events of chains of ``chain_length`` with no operation rows (the log alone)."""
    now = timezone.now()
    start = now - SPAN
    step = SPAN / max(n, 1)

    base = AuditEvent.objects.count()  # not inside the COPY: its connection is busy then

    def rows() -> Iterator[tuple[Any, ...]]:
        chain: Chain | None = None
        for i in range(n):
            if chain is None or chain.seq >= chain_length:
                chain = Chain(f"audit-{base + i:09d}")
            yield chain.event(start + step * i, "transition", _SYSTEM, {"event": "bench", "i": i})

    made = Writer(AuditEvent._meta.db_table, AUDIT_COLUMNS).write(rows())
    analyze()
    return made


def _columns(model: Any) -> list[str]:
    return [field.column for field in model._meta.concrete_fields]


def _defaults(model: Any, seeded: list[str]) -> tuple[list[str], tuple[Any, ...]]:
    """The columns of ``model`` not in ``seeded``, and each one's default as a row holds it."""
    rest = [field for field in model._meta.concrete_fields if field.column not in seeded]
    values = tuple(
        json.dumps(field.get_default())
        if isinstance(field, models.JSONField)
        else field.get_default()
        for field in rest
    )
    return [field.column for field in rest], values


def _next_id(model: Any) -> int:
    last = model.objects.order_by("-pk").values_list("pk", flat=True).first()
    return int(last or 0) + 1


def _sequences_reset() -> None:
    sql = connection.ops.sequence_reset_sql(
        no_style(), [Operation, Dispatch, Evidence, LookupAttempt, AuditEvent]
    )
    with connection.cursor() as cursor:
        for statement in sql:
            cursor.execute(statement)


def analyze() -> None:
    """What autovacuum would do after a bulk load (this machine runs with it off)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
