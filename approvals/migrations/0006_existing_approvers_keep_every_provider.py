"""Approvers made before scopes could decide for every provider: they keep that scope,
and approvals made before learn their host from who requested them ("host:NAME")."""

from django.db import migrations


def forwards(apps, schema_editor):
    Approver = apps.get_model("approvals", "Approver")
    Approval = apps.get_model("approvals", "Approval")
    Approver.objects.update(all_providers=True)
    for approval in Approval.objects.filter(host="", requested_by__startswith="host:"):
        approval.host = approval.requested_by.removeprefix("host:")
        approval.save(update_fields=["host"])


class Migration(migrations.Migration):
    dependencies = [("approvals", "0005_approver_scope_approval_host")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
