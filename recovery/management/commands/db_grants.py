"""Grant the application's database role what Settle needs, and nothing more.

Why: the triggers of ``audit``'s append-only migration refuse UPDATE, DELETE and
TRUNCATE on the audit tables, but the owner of a table (who ran ``migrate``) can disable
or drop them. So Settle runs under a second role that owns nothing: it may read and
write the ordinary tables, only read and append the audit tables, and use the sequences.
It cannot change, delete or truncate audit records, nor alter, disable or drop a table,
trigger or function; whatever it writes to the audit log stays there.

The SQL is idempotent and converges (extra table privileges are revoked), and it covers
the tables that exist when it runs: run it again, as the owner, after every
``migrate``. Without ``--apply`` it is only printed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from audit.models import AuditCheckpoint, AuditEvent

SCHEMA = "public"
AUDIT_TABLES = (AuditEvent._meta.db_table, AuditCheckpoint._meta.db_table)


def grants_sql(role: str, database: str) -> list[str]:
    """The statements, in order, with every name quoted as an identifier."""
    names = {
        "role": sql.Identifier(role),
        "database": sql.Identifier(database),
        "schema": sql.Identifier(SCHEMA),
        "audit": sql.SQL(", ").join(sql.Identifier(table) for table in AUDIT_TABLES),
    }
    statements = (
        "GRANT CONNECT ON DATABASE {database} TO {role}",
        "GRANT USAGE ON SCHEMA {schema} TO {role}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
        "REVOKE TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA {schema} FROM {role}",
        "REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLE {audit} FROM {role}",
        "GRANT SELECT, INSERT ON TABLE {audit} TO {role}",
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
        "REVOKE UPDATE ON ALL SEQUENCES IN SCHEMA {schema} FROM {role}",
    )
    return [sql.SQL(text).format(**names).as_string(None) + ";" for text in statements]


class Command(BaseCommand):
    help = (
        "Print (or --apply, as the owner role that ran migrate) the grants that let ROLE "
        "run Settle with least privilege: no UPDATE, DELETE or TRUNCATE of audit records. "
        "Run again after every migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role", help="the application's database role (it owns nothing)")
        parser.add_argument("--apply", action="store_true", help="execute instead of printing")

    def handle(self, *args: Any, role: str, apply: bool = False, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                f"least privilege is a PostgreSQL deployment; this database is {connection.vendor}"
            )
        statements = grants_sql(role, str(connection.settings_dict["NAME"]))
        if not apply:
            self.stdout.write("\n".join(statements))
            return
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT rolsuper OR rolname = current_user OR EXISTS ("
                    " SELECT 1 FROM pg_tables WHERE schemaname = %s AND tableowner = rolname"
                    ") FROM pg_roles WHERE rolname = %s",
                    [SCHEMA, role],
                )
                found = cursor.fetchone()
                if found is None:
                    raise CommandError(f"there is no role {role!r}: CREATE ROLE it first")
                if found[0]:
                    raise CommandError(
                        f"{role!r} is a superuser, runs this command or owns tables: the "
                        "application needs a role of its own that owns nothing"
                    )
                for statement in statements:
                    cursor.execute(statement)
        except DatabaseError as exc:
            raise CommandError(f"the grants failed (run this as the owner role): {exc}") from exc
        self.stdout.write(f"granted least privilege to {role!r} ({len(statements)} statements)")
