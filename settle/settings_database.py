"""The database: ``DATABASES`` from ``DATABASE_URL``, and the bounds on every session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from settle.settings_env import VAR_DIR, env_bool, env_int, env_str

# Bounds on every PostgreSQL session of the web and the workers: how long a connection
# attempt, one statement, one wait for a lock and a transaction left idle may last. A
# statement cut by one answers 503 (``database_timeout``), never hangs the request.
# Management commands (``manage.py``, ``django-admin``: migrate, verify_audit, exports,
# benchmarks) run long statements by design: for them SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS
# (0: none) bounds statements and lock waits instead.
_DB_CONNECT_TIMEOUT_SECONDS = env_int("SETTLE_DB_CONNECT_TIMEOUT_SECONDS", 5, minimum=1)
SETTLE_DB_STATEMENT_TIMEOUT_MS = env_int("SETTLE_DB_STATEMENT_TIMEOUT_MS", 30000)
SETTLE_DB_LOCK_TIMEOUT_MS = env_int("SETTLE_DB_LOCK_TIMEOUT_MS", 10000)
SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env_int(
    "SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 120000
)
SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS = env_int("SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS", 0)
# The test runner counts as a command: it creates, flushes and drops whole databases (a
# DROP DATABASE waits for a checkpoint); the servers a test starts are bounded.
_ARGV0 = Path(sys.argv[0] if sys.argv else "")
_COMMAND = (
    _ARGV0.name in {"manage.py", "django-admin"}
    or _ARGV0.parts[-2:] == ("django", "__main__.py")
    or "pytest" in sys.modules
) and sys.argv[1:2] != ["runserver"]


def _db_bounds() -> list[str]:
    """The ``-c`` options that bound this process's sessions (0 turns a bound off)."""
    statement = SETTLE_DB_STATEMENT_TIMEOUT_MS
    lock = SETTLE_DB_LOCK_TIMEOUT_MS
    if _COMMAND:
        statement = lock = SETTLE_DB_COMMAND_STATEMENT_TIMEOUT_MS
    return [
        f"-c statement_timeout={statement}",
        f"-c lock_timeout={lock}",
        f"-c idle_in_transaction_session_timeout={SETTLE_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS}",
    ]


def _database() -> dict[str, object]:
    url = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'settle.sqlite3'}")
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url, conn_max_age=60))
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
    engine = str(config.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        # Writers queue on BEGIN IMMEDIATE instead of failing on lock upgrade; the test
        # database is a file so that real worker processes can share it.
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        config["CONN_MAX_AGE"] = 0
        # One file per test run, so that concurrent runs never share (and break) it.
        config["TEST"] = {"NAME": str(VAR_DIR / f"test_settle_{os.getpid()}.sqlite3")}
    elif engine.endswith("postgresql"):
        options = config.setdefault("OPTIONS", {})
        assert isinstance(options, dict)
        if env_bool("SETTLE_DB_PREPARED_STATEMENTS", True):
            # Parameters travel apart from the SQL text, so each statement's text is the
            # same on every call and psycopg prepares it on its connection after a few
            # runs: PostgreSQL then skips parsing and planning (a third of its CPU per
            # API call). Turn off behind a pooler that cannot keep prepared statements
            # (PgBouncer in transaction mode before 1.21).
            options.setdefault("server_side_binding", True)
            options.setdefault("prepare_threshold", 5)
        # A connection held across requests (CONN_MAX_AGE) is checked before a request
        # reuses it, so that a database restart costs no request a dead connection; by
        # asking its socket, not the database (settle.postgresql).
        config["ENGINE"] = "settle.postgresql"
        config["CONN_HEALTH_CHECKS"] = True
        # A database that does not answer fails the request in seconds, never hangs it.
        options.setdefault("connect_timeout", _DB_CONNECT_TIMEOUT_SECONDS)
        # No JIT compilation: it pays off for long analytical queries only, and the
        # planner starts it by estimated cost, so a page whose LIMIT stops a scan early
        # but whose estimate is large (the queue's counts) paid 0.5-1 s of compiling per
        # request (docs/benchmarks.md). Then the bounds on each session's statements; a
        # URL's own ``?options=`` comes after these, so it wins.
        given = str(options.get("options", ""))
        options["options"] = " ".join(["-c jit=off", *_db_bounds(), *([given] if given else [])])
    else:
        raise ImproperlyConfigured(f"DATABASE_URL engine {engine!r} is not supported")
    return config


DATABASES = {"default": _database()}
