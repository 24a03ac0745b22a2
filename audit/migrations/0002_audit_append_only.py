"""On PostgreSQL, refuse UPDATE, DELETE and TRUNCATE of audit events and checkpoints.

The triggers stop the application's own role (see ``manage.py db_grants``); a table
owner or superuser can still disable them, which the signed checkpoints then reveal.
"""

from django.db import migrations

TABLES = ("audit_auditevent", "audit_auditcheckpoint")

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION settle_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit records are append-only (% on %)', TG_OP, TG_TABLE_NAME;
END;
$$ LANGUAGE plpgsql;
"""

CREATE_TRIGGERS = """
CREATE TRIGGER {table}_append_only
    BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION settle_audit_append_only();
CREATE TRIGGER {table}_no_truncate
    BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION settle_audit_append_only();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS {table}_append_only ON {table};
DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE_FUNCTION, params=None)
        for table in TABLES:
            schema_editor.execute(CREATE_TRIGGERS.format(table=table))


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(DROP_TRIGGERS.format(table=table))
        schema_editor.execute("DROP FUNCTION IF EXISTS settle_audit_append_only()")


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
