"""Give the system chain its stored head, and every signed chain its vouched head.

The system chain's head is its newest event as stored; the vouched heads are the newest
head each stored checkpoint signed, signed under the audit key (``verify_audit`` checks
the checkpoints, and every chain against every one of them).
"""

from django.db import migrations

GENESIS_HASH = "sha256:" + "0" * 64


def forwards(apps, schema_editor):
    from recovery.audit.checkpoints import vouched_heads_rebuild

    AuditEvent = apps.get_model("recovery", "AuditEvent")
    AuditChainHead = apps.get_model("recovery", "AuditChainHead")
    last = AuditEvent.objects.filter(operation_key="").order_by("-seq").first()
    AuditChainHead.objects.create(
        chain="",
        seq=last.seq if last else 0,
        hash=last.hash if last else GENESIS_HASH,
    )
    vouched_heads_rebuild()


def backwards(apps, schema_editor):
    apps.get_model("recovery", "AuditChainHead").objects.all().delete()
    apps.get_model("recovery", "AuditVouchedHead").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [("recovery", "0017_audit_heads_vouched_alarms")]
    operations = [migrations.RunPython(forwards, backwards)]
