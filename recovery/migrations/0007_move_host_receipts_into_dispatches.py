"""Copy each host receipt into its dispatch's row, and each chain's head into its operation."""

from django.db import migrations


def forwards(apps, schema_editor):
    Dispatch = apps.get_model("recovery", "Dispatch")
    HostReceipt = apps.get_model("recovery", "HostReceipt")
    Operation = apps.get_model("recovery", "Operation")
    AuditEvent = apps.get_model("recovery", "AuditEvent")
    for receipt in HostReceipt.objects.all().iterator():
        Dispatch.objects.filter(pk=receipt.dispatch_id).update(
            receipt_status=receipt.status,
            receipt_reference=receipt.provider_reference,
            receipt_recovered=receipt.recovered,
            receipt_evidence_id=receipt.evidence_id,
            receipt_reported_at=receipt.reported_at,
        )
    for operation in Operation.objects.all().iterator():
        last = AuditEvent.objects.filter(operation_key=operation.key).order_by("-seq").first()
        if last is not None:
            Operation.objects.filter(pk=operation.pk).update(
                audit_seq=last.seq, audit_hash=last.hash
            )


class Migration(migrations.Migration):
    dependencies = [("recovery", "0006_dispatch_receipt_fields_operation_audit_head")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
