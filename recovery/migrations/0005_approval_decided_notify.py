"""On PostgreSQL, NOTIFY ``settle_decided`` with the operation's id when it leaves
``awaiting_approval``: what wakes a request held by ``?wait=`` (``recovery.services.waits``).

Not when the row awaited approval only inside the transaction that decides it (a policy
approving as the approval opens): nobody outside could be waiting for it, and a NOTIFY
makes its commit queue on the server's notification lock.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION settle_approval_decided() RETURNS trigger AS $$
BEGIN
    IF OLD.xmin <> pg_current_xact_id()::xid THEN
        PERFORM pg_notify('settle_decided', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER recovery_operation_decided
    AFTER UPDATE OF state ON recovery_operation
    FOR EACH ROW
    WHEN (OLD.state = 'awaiting_approval' AND NEW.state <> 'awaiting_approval')
    EXECUTE FUNCTION settle_approval_decided();
"""

DROP = """
DROP TRIGGER IF EXISTS recovery_operation_decided ON recovery_operation;
DROP FUNCTION IF EXISTS settle_approval_decided();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("recovery", "0004_host_display_name")]
    operations = [migrations.RunPython(forwards, backwards)]
