"""Give the system chain its stored head, and every signed chain its vouched head.

The system chain's head is its newest event as stored; the vouched heads are the newest
head each stored checkpoint signed, signed under the audit key as
``recovery.audit.checkpoints`` signs them (``verify_audit`` checks the checkpoints, and
every chain against every one of them). Written with the historical models, and the
signature spelled out here, so that later changes to the code cannot change this step.
"""

import hashlib
import hmac

from django.conf import settings
from django.db import migrations

from recovery.canonical import canonical_dumps, sha256_digest

GENESIS_HASH = "sha256:" + "0" * 64


def _signature(chain, seq, digest, number):
    content = sha256_digest(
        canonical_dumps({"chain": chain, "seq": seq, "hash": digest, "checkpoint": number})
    )
    key = str(settings.SETTLE_AUDIT_KEY).encode("utf-8")
    return "hmac-sha256:" + hmac.new(key, content.encode("ascii"), hashlib.sha256).hexdigest()


def forwards(apps, schema_editor):
    AuditEvent = apps.get_model("recovery", "AuditEvent")
    AuditChainHead = apps.get_model("recovery", "AuditChainHead")
    AuditCheckpoint = apps.get_model("recovery", "AuditCheckpoint")
    AuditVouchedHead = apps.get_model("recovery", "AuditVouchedHead")
    last = AuditEvent.objects.filter(operation_key="").order_by("-seq").first()
    AuditChainHead.objects.create(
        chain="",
        seq=last.seq if last else 0,
        hash=last.hash if last else GENESIS_HASH,
    )
    newest = {}
    for checkpoint in AuditCheckpoint.objects.order_by("number").iterator():
        for chain, (seq, digest) in checkpoint.heads.items():
            newest[chain] = (int(seq), str(digest), checkpoint.number)
    AuditVouchedHead.objects.bulk_create(
        [
            AuditVouchedHead(
                chain=chain,
                seq=seq,
                hash=digest,
                checkpoint=number,
                signature=_signature(chain, seq, digest, number),
            )
            for chain, (seq, digest, number) in newest.items()
        ],
        batch_size=1000,
    )


def backwards(apps, schema_editor):
    apps.get_model("recovery", "AuditChainHead").objects.all().delete()
    apps.get_model("recovery", "AuditVouchedHead").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("recovery", "0017_audit_heads_vouched_alarms")]
    operations = [migrations.RunPython(forwards, backwards)]
