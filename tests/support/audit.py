"""The audit log as the tamper tests touch it: events appended, SQL run as a table owner
with the append-only triggers off, a chain forged with its hashes recomputed, and the
hash an auditor computes offline from an export."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785
from django.db import connection
from fido2.utils import websafe_decode, websafe_encode

from audit.chain import audit_append, audit_transaction
from audit.hashing import GENESIS_HASH, SYSTEM_CHAIN, event_digest
from audit.kinds import AuditKind
from audit.models import AuditChainHead, AuditEvent
from audit.verify_walk import audit_verify
from common.actors import Actor
from recovery.models import Operation
from recovery.services.locking import operation_lock

AUDIT_TABLES = ("audit_auditevent", "audit_auditcheckpoint")
GENESIS = "sha256:" + "0" * 64


def sign_again_recorded(
    chain: str, person: Any, kind: str, decision: str = "approve", **subject: str
) -> None:
    """The one ``signature_refused`` event is ``person``'s "sign again" on ``chain``: a
    signed answer to no statement the page kept, naming the decision the form claimed."""
    refused = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert (refused.operation_key, refused.actor) == (chain, Actor.of("user", person))
    assert refused.data == {
        "kind": kind,
        "decision": decision,
        "code": "signature_invalid",
        "message": "sign again: this page asked for no such signature",
        **subject,
    }


def events_append(operation: Operation, count: int) -> None:
    for number in range(count):
        with audit_transaction():
            audit_append(kind="test", operation=operation_lock(operation), data={"n": number})


def sql_as_owner(sql: str, params: list | None = None) -> None:
    """Run SQL as a table owner would, with the append-only triggers switched off."""
    if connection.vendor == "sqlite" and sql.startswith("TRUNCATE "):
        sql = sql.replace("TRUNCATE ", "DELETE FROM ", 1)  # SQLite's spelling of it
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in AUDIT_TABLES:
                cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        cursor.execute(sql, params or [])
        if connection.vendor == "postgresql":
            for table in AUDIT_TABLES:
                cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def only_problem() -> str:
    problems = [str(problem) for problem in audit_verify()]
    assert len(problems) == 1, problems
    return problems[0]


def chain_forge(key: str) -> None:
    """Edit the chain's first event and recompute every hash, triggers off (PostgreSQL)."""
    prev = GENESIS_HASH
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER USER")
        for event in AuditEvent.objects.filter(operation_key=key).order_by("seq"):
            if event.seq == 1:
                event.actor = Actor.system("forged")
            event.prev_hash = prev
            event.hash = event_digest(event)
            cursor.execute(
                "UPDATE audit_auditevent SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [event.actor.stored if event.actor else "", prev, event.hash, event.pk],
            )
            prev = event.hash
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER USER")
    Operation.objects.filter(key=key).update(audit_hash=prev)


def offline_hash(record: dict[str, Any]) -> str:
    """What docs/audit-export.md tells an auditor to run: no Settle code, the exported fields."""
    data = record["data"]
    content = {
        "seq": int(record["seq"]),
        "at": record["at"],
        "kind": record["kind"],
        "operation_key": record["chain"],
        "actor": record["actor"],
        "data": json.loads(data) if isinstance(data, str) else data,
    }
    digest = hashlib.sha256(record["prev_hash"].encode("ascii") + rfc8785.dumps(content))
    return "sha256:" + digest.hexdigest()


def signature_byte_changed(data: dict[str, Any]) -> dict[str, Any]:
    """A signed decision's event data with one byte of its passkey signature flipped."""
    signature = bytearray(websafe_decode(data["signature"]["signature"]))
    signature[len(signature) // 2] ^= 0x01
    return {**data, "signature": {**data["signature"], "signature": websafe_encode(signature)}}


def event_data_stored(event: AuditEvent, data: dict[str, Any]) -> None:
    """Overwrite the event's data with SQL, its hash left as it was."""
    sql_as_owner(
        "UPDATE audit_auditevent SET data = %s WHERE id = %s", [json.dumps(data), event.pk]
    )


def event_data_forged(event: AuditEvent, data: dict[str, Any]) -> None:
    """Overwrite the event's data and recompute its chain's hashes and head, as someone
    with SQL access alone can where no checkpoint signed the chain yet."""
    event_data_stored(event, data)
    prev = None
    for each in AuditEvent.objects.filter(operation_key=event.operation_key).order_by("seq"):
        if prev is not None:
            each.prev_hash = prev
        each.hash = event_digest(each)
        sql_as_owner(
            "UPDATE audit_auditevent SET prev_hash = %s, hash = %s WHERE id = %s",
            [each.prev_hash, each.hash, each.pk],
        )
        prev = each.hash
    if event.operation_key == SYSTEM_CHAIN:
        AuditChainHead.objects.filter(chain=SYSTEM_CHAIN).update(hash=prev)
    else:
        Operation.objects.filter(key=event.operation_key).update(audit_hash=prev)
