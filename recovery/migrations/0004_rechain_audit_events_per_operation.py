"""Re-link the events of the single global chain into one chain per operation.

Until now every event followed the previous one of any operation; from now on each
operation (and the system, ``""``) has a chain of its own, numbered from 1. The global
chain is verified first: a history that is already broken is not re-signed.
"""

import hashlib

import rfc8785
from django.db import migrations
from django.db.models import F

GENESIS_HASH = "sha256:" + "0" * 64


def _hash(prev_hash, seq, event):
    content = rfc8785.dumps(
        {
            "seq": seq,
            "at": event.at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "kind": event.kind,
            "operation_key": event.operation_key,
            "actor": event.actor,
            "data": event.data,
        }
    )
    return "sha256:" + hashlib.sha256(prev_hash.encode("ascii") + content).hexdigest()


def rechain(apps, schema_editor):
    AuditEvent = apps.get_model("recovery", "AuditEvent")
    events = list(AuditEvent.objects.order_by("seq"))
    prev = GENESIS_HASH
    for expected, event in enumerate(events, start=1):
        if (
            event.seq != expected
            or event.prev_hash != prev
            or _hash(prev, expected, event) != event.hash
        ):
            raise RuntimeError(f"audit chain broken at event #{expected}; fix before migrating")
        prev = event.hash
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP TRIGGER IF EXISTS recovery_auditevent_append_only ON recovery_auditevent"
        )
    # Out of the way first, so that no (chain, seq) clashes while renumbering.
    AuditEvent.objects.update(seq=-F("id"))
    heads = {}
    for event in sorted(events, key=lambda e: e.id):
        seq, prev = heads.get(event.operation_key, (0, GENESIS_HASH))
        digest = _hash(prev, seq + 1, event)
        AuditEvent.objects.filter(pk=event.pk).update(seq=seq + 1, prev_hash=prev, hash=digest)
        heads[event.operation_key] = (seq + 1, digest)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0003_per_operation_audit_chains_and_lookup_leases")]
    operations = [migrations.RunPython(rechain, migrations.RunPython.noop)]
