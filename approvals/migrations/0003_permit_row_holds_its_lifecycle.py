"""The permit row records who consumed and revoked it; drop the history lines it now holds.

Issued, consumed and revoked lines are read back from the row (``permit_history``);
refusals, ignored revocations and expiry stay events.
"""

from django.db import migrations


def forwards(apps, schema_editor):
    Permit = apps.get_model("approvals", "Permit")
    PermitEvent = apps.get_model("approvals", "PermitEvent")
    for event in PermitEvent.objects.filter(kind__in=["consumed", "revoked"]).iterator():
        field = "consumed_by" if event.kind == "consumed" else "revoked_by"
        Permit.objects.filter(pk=event.permit_id).update(**{field: event.actor})
    PermitEvent.objects.filter(kind__in=["issued", "consumed", "revoked"]).delete()


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_permit_consumed_by_revoked_by")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
