"""On PostgreSQL, refuse UPDATE and DELETE on audit events at the database itself."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION settle_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER recovery_auditevent_append_only
    BEFORE UPDATE OR DELETE ON recovery_auditevent
    FOR EACH ROW EXECUTE FUNCTION settle_audit_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS recovery_auditevent_append_only ON recovery_auditevent;
DROP FUNCTION IF EXISTS settle_audit_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
