"""Settle runs under a role of its own that can append to the audit log and never rewrite it.

The test's connection plays the owner (the role that ran ``migrate``); a fresh LOGIN role
(unique per run: roles are cluster-global) gets ``manage.py db_grants ROLE --apply``.
Then, under that role: gunicorn serves a whole lifecycle and a crash released from the
provider's evidence (looked up by a Celery worker under the same role), all 2xx;
``verify_audit`` verifies and signs a checkpoint; and a
plain connection is refused (SQLSTATE 42501, insufficient_privilege) every way of
changing, deleting, truncating or unprotecting the audit tables, while it may still
append to them and update ordinary tables. The role is dropped afterwards, also when
the test fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from psycopg import errors, sql

from approvals.services.approvers import approver_create
from audit.models import AuditCheckpoint, AuditEvent
from audit.verify_walk import audit_verify
from harness.gunicorn import GunicornServer, database_url, gunicorn_running
from harness.providers import digest_of, sqlite_provider_commit, sqlite_provider_init
from recovery.management.commands.db_grants import AUDIT_TABLES
from recovery.models import Operation
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.live import Http, resume_polled, wait_lease_lapsed

REPO_ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}
INSUFFICIENT_PRIVILEGE = "42501"
TABLE_PRIVILEGES = {"SELECT", "INSERT", "UPDATE", "DELETE"}
AUDIT_PRIVILEGES = {"SELECT", "INSERT"}


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("least privilege is a PostgreSQL deployment (roles, grants, triggers)")


def _q(template: str, **names: str) -> str:
    """``template`` with each ``{name}`` replaced by a quoted identifier."""
    identifiers = {key: sql.Identifier(value) for key, value in names.items()}
    return sql.SQL(template).format(**identifiers).as_string(None)


def _owner_execute(statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return list(cursor.fetchall()) if cursor.description else []


def _role_sessions(role: str) -> int:
    rows = _owner_execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role])
    return int(rows[0][0])


def _drop_role(role: str) -> None:
    """Wait (bounded) for the role's sessions to end, then drop everything it has, and it."""
    deadline = time.monotonic() + 15
    while _role_sessions(role) and time.monotonic() < deadline:
        time.sleep(0.1)
    # Only sessions of this run's own role can be left: the ones this test opened.
    _owner_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
    )
    _owner_execute(_q("REASSIGN OWNED BY {role} TO CURRENT_USER", role=role))
    _owner_execute(_q("DROP OWNED BY {role}", role=role))
    _owner_execute(_q("DROP ROLE {role}", role=role))


@pytest.fixture
def app_role(transactional_db: None) -> Iterator[str]:
    """A LOGIN role of this run's own, with ``db_grants --apply``; dropped at teardown."""
    _postgres_only()
    role = f"settle_lp_app_{os.getpid()}_{secrets.token_hex(4)}"
    _owner_execute(_q("CREATE ROLE {role} LOGIN", role=role))
    try:
        call_command("db_grants", role, apply=True, stdout=io.StringIO())
        yield role
    finally:
        _drop_role(role)


def _role_url(role: str) -> str:
    return database_url({**connection.settings_dict, "USER": role, "PASSWORD": ""})


@contextlib.contextmanager
def _role_connection(role: str) -> Iterator[psycopg.Connection[Any]]:
    settings_dict = connection.settings_dict
    conn = psycopg.connect(
        host=str(settings_dict.get("HOST") or "127.0.0.1"),
        port=int(settings_dict.get("PORT") or 5432),
        dbname=str(settings_dict["NAME"]),
        user=role,
        autocommit=True,
        connect_timeout=10,
    )
    try:
        yield conn
    finally:
        conn.close()


def _table_privileges(role: str) -> dict[str, set[str]]:
    """table → the privileges granted to ``role`` on it (public schema, from the ACLs)."""
    rows = _owner_execute(
        "SELECT c.relname, a.privilege_type FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v')"
        " AND a.grantee = to_regrole(%s)",
        [role],
    )
    granted: dict[str, set[str]] = {}
    for table, privilege in rows:
        granted.setdefault(str(table), set()).add(str(privilege))
    return granted


def _ok(answer: tuple[int, dict[str, Any]], server: GunicornServer, step: str) -> dict[str, Any]:
    status, body = answer
    assert 200 <= status < 300, f"{step}: {status} {body}\n{server.log_tail()}"
    return body


# -- the command itself ------------------------------------------------------------------


def test_db_grants_refuses_sqlite(monkeypatch: pytest.MonkeyPatch, db: None) -> None:
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError, match="least privilege is a PostgreSQL deployment"):
        call_command("db_grants", "settle_app", stdout=io.StringIO())


def test_db_grants_prints_quoted_sql_and_refuses_an_unfit_role(db: None) -> None:
    _postgres_only()
    out = io.StringIO()
    call_command("db_grants", 'app"; DROP TABLE x; --', stdout=out)
    printed = out.getvalue()
    assert '"app""; DROP TABLE x; --"' in printed
    lines = printed.strip().splitlines()
    assert len(lines) == 8 and all(line.endswith(";") for line in lines)
    for table in AUDIT_TABLES:
        assert f'"{table}"' in printed
    with pytest.raises(CommandError, match="superuser, runs this command or owns tables"):
        call_command("db_grants", connection.settings_dict["USER"] or "postgres", apply=True)
    with pytest.raises(CommandError, match="there is no role"):
        call_command("db_grants", f"settle_lp_missing_{secrets.token_hex(4)}", apply=True)


def test_db_grants_is_idempotent_and_converges(app_role: str) -> None:
    # An earlier, wider grant (a mistake, or an old deployment) is taken back.
    _owner_execute(_q("GRANT ALL ON audit_auditevent, recovery_operation TO {r}", r=app_role))
    for _ in range(2):
        call_command("db_grants", app_role, apply=True, stdout=io.StringIO())
    granted = _table_privileges(app_role)
    public = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    tables = {str(row[0]) for row in _owner_execute(public)}
    assert set(granted) == tables
    for table in tables:
        expected = AUDIT_PRIVILEGES if table in AUDIT_TABLES else TABLE_PRIVILEGES
        assert granted[table] == expected, table


# -- Settle under the application role --------------------------------------------------


@pytest.mark.processes
def test_settle_runs_as_a_role_that_can_only_append_to_the_audit_log(
    app_role: str,
    tmp_path: Path,
    settings: Any,
    celery_procs: Any,
    celery_queue: str,
) -> None:
    role_url = _role_url(app_role)
    checkpoints = tmp_path / "audit-checkpoints.jsonl"
    settings.SETTLE_AUDIT_CHECKPOINT_FILE = checkpoints
    env = {
        "SETTLE_AUDIT_KEY": str(settings.SETTLE_AUDIT_KEY),
        "SETTLE_AUDIT_CHECKPOINT_FILE": str(checkpoints),
    }
    # The background worker that runs the lookups resume queues, under the role too.
    lookups = celery_procs(
        "worker", {**env, "DATABASE_URL": role_url, "SETTLE_CELERY_QUEUE": celery_queue}
    )

    # Credentials and providers are the administrator's (owner's) doing.
    _, host_token = host_create(name="fleet-a")
    _, approver_token = approver_create(name="alice-phone", all_providers=True)
    orders = tmp_path / "orders.sqlite3"
    sqlite_provider_init(orders)
    for name, lease in (("orders", 60), ("orders-short", 1)):
        provider_configure(
            name=name, adapter="sqlite", path=str(orders), lease_seconds=lease, timeout_seconds=5
        )

    started = time.monotonic()
    with gunicorn_running(
        database_url=role_url,
        log_path=tmp_path / "gunicorn.log",
        workers=2,
        env={**env, "SETTLE_CELERY_QUEUE": celery_queue},
    ) as server:
        host, approver = Http(server.url, host_token), Http(server.url, approver_token)

        def approved(key: str, provider: str) -> dict[str, Any]:
            body = {"key": key, "action": "payment.send", "provider": provider, "params": PARAMS}
            _ok(host.post("/api/v1/operations", body), server, f"{key} register")
            approval = _ok(host.post(f"/api/v1/operations/{key}/approvals"), server, "open")
            decision = {"decision": "approve", "params_digest": digest_of(PARAMS)}
            path = f"/api/v1/approvals/{approval['approval_id']}/decision"
            _ok(approver.post(path, decision), server, f"{key} approve")
            dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
            path = f"/api/v1/operations/{key}/dispatch"
            return _ok(host.post(path, dispatch), server, f"{key} dispatch")

        # 1. The whole lifecycle, reported by the worker.
        token = approved("lp-committed", "orders")["fencing_token"]
        beat = {"fencing_token": token}
        _ok(host.post("/api/v1/operations/lp-committed/heartbeat", beat), server, "heartbeat")
        report = {"fencing_token": token, "outcome": "committed", "provider_reference": "r-1"}
        path = "/api/v1/operations/lp-committed/result"
        assert _ok(host.post(path, report), server, "report")["state"] == "released"

        # 2. The worker commits at the provider and dies; resume queues a lookup, the
        # Celery worker finds the evidence, and the next resume answers released.
        approved("lp-crashed", "orders-short")
        sqlite_provider_commit(
            orders, operation_key="lp-crashed", params=PARAMS, reference="ref-lp-crashed"
        )
        wait_lease_lapsed("lp-crashed")
        try:
            answers = resume_polled(server.url, host_token, "lp-crashed", worker="w2")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{server.log_tail()}") from exc
        assert answers[0]["decision"] == "in_progress", answers
        assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
        record = _ok(host.get("/api/v1/operations/lp-crashed"), server, "record")
        assert record["receipt"]["recovered"] is True
    lifecycle_seconds = time.monotonic() - started
    lookups.stop()  # its sessions end before the role is dropped
    done = [line for line in lookups.log().splitlines() if "succeeded in" in line]
    assert any("recovery.tasks.lookup_attempt[" in line for line in done), lookups.log()[-4000:]

    # verify_audit under the role: verifies, and signs a checkpoint (an INSERT).
    verified = subprocess.run(
        [sys.executable, "manage.py", "verify_audit"],
        cwd=REPO_ROOT,
        env={**os.environ, **env, "DATABASE_URL": role_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "audit log intact" in verified.stdout
    assert AuditCheckpoint.objects.count() == 1
    assert [json.loads(line)["number"] for line in checkpoints.read_text().splitlines()] == [1]
    assert list(audit_verify()) == []
    assert Operation.objects.get(key="lp-crashed").recovered is True

    with _role_connection(app_role) as conn:
        _assert_refused_to_the_role(conn, app_role)
        _assert_allowed_to_the_role(conn)
    _assert_trigger_refuses_the_owner()
    assert list(audit_verify()) == []
    print(f"lifecycle through gunicorn as {app_role}: {lifecycle_seconds:.1f} s")


def _refused_statements(role: str) -> list[str]:
    statements = []
    for table in AUDIT_TABLES:
        trigger, no_truncate = f"{table}_append_only", f"{table}_no_truncate"
        statements += [
            _q("UPDATE {t} SET id = id", t=table),
            _q("DELETE FROM {t}", t=table),
            _q("TRUNCATE {t}", t=table),
            _q("ALTER TABLE {t} DISABLE TRIGGER ALL", t=table),
            _q("ALTER TABLE {t} DISABLE TRIGGER {g}", t=table, g=trigger),
            _q("DROP TRIGGER {g} ON {t}", t=table, g=trigger),
            _q("DROP TRIGGER {g} ON {t}", t=table, g=no_truncate),
            _q("ALTER TABLE {t} OWNER TO {r}", t=table, r=role),
            _q("DROP TABLE {t}", t=table),
        ]
    return [
        *statements,
        # Neither the trigger function nor the session setting that skips triggers.
        "DROP FUNCTION settle_audit_append_only()",
        "CREATE OR REPLACE FUNCTION settle_audit_append_only() RETURNS trigger"
        " AS $$ BEGIN RETURN NULL; END; $$ LANGUAGE plpgsql",
        "SET session_replication_role = replica",
        # No TRUNCATE and no DDL anywhere.
        "TRUNCATE recovery_operation",
        "CREATE TABLE settle_lp_probe (id int)",
    ]


def _assert_refused_to_the_role(conn: psycopg.Connection[Any], role: str) -> None:
    for statement in _refused_statements(role):
        with pytest.raises(errors.InsufficientPrivilege) as refused:
            conn.execute(statement)
        assert refused.value.sqlstate == INSUFFICIENT_PRIVILEGE, statement


def _assert_allowed_to_the_role(conn: psycopg.Connection[Any]) -> None:
    events = AuditEvent.objects.count()
    with conn.transaction(force_rollback=True):
        inserted = conn.execute(
            "INSERT INTO audit_auditevent"
            " (seq, at, kind, operation_key, actor, data, prev_hash, hash)"
            " VALUES (1, now(), 'probe', 'lp-probe', 'test', '{}', 'x', 'y') RETURNING id"
        ).fetchone()
        assert inserted is not None
        row = conn.execute(
            "SELECT kind FROM audit_auditevent WHERE id = %s", [inserted[0]]
        ).fetchone()
        assert row == ("probe",)
        updated = conn.execute(
            "UPDATE recovery_operation SET updated_at = now() WHERE key = 'lp-committed'"
        )
        assert updated.rowcount == 1
    assert AuditEvent.objects.count() == events  # rolled back


def _assert_trigger_refuses_the_owner() -> None:
    """The owner has the privileges; the trigger refuses it all the same (until disabled)."""
    for table in AUDIT_TABLES:
        for statement in ("UPDATE {t} SET id = id", "DELETE FROM {t}", "TRUNCATE {t}"):
            with pytest.raises(DatabaseError) as refused, transaction.atomic():
                _owner_execute(_q(statement, t=table))
            cause = refused.value.__cause__
            assert isinstance(cause, psycopg.Error) and cause.sqlstate == "P0001", statement
            assert "append-only" in str(cause), statement
