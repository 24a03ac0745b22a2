"""``settle.wsgi.application`` plus a count of the SQL statements each request cost.

Run in place of the production module for the SQL pass of ``bench/api.py``::

    gunicorn bench.counting_wsgi -w 4 -b 127.0.0.1:PORT

Every response gets two headers:

``X-Settle-SQL``
    The number of statements this request sent to the database on Django's ``default``
    connection, counted as follows:

    * every statement Django executes through a cursor, seen by
      ``connection.execute_wrapper``: queries, DML, ``SELECT ... FOR UPDATE``, and the
      ``SAVEPOINT`` / ``RELEASE SAVEPOINT`` / ``ROLLBACK TO SAVEPOINT`` of nested
      ``atomic`` blocks (Django sends those through a cursor too). ``executemany`` counts
      one statement per parameter set;
    * +1 ``BEGIN`` per outermost transaction that executed at least one statement. On
      psycopg 3 Django opens a transaction by turning autocommit off and psycopg sends
      ``BEGIN`` implicitly with the transaction's first statement, so it is counted
      there: at the first statement executed while the connection is not in autocommit
      mode and no transaction of ours is open;
    * +1 ``COMMIT`` or ``ROLLBACK`` when that transaction ends (the connection's
      ``_commit`` / ``_rollback`` are wrapped: Django does not send them through
      execute wrappers). A commit or rollback of a transaction that executed nothing
      sends nothing and counts nothing.

    Not counted: what happens when a connection is opened (the protocol handshake and
    Django's ``SET TIME ZONE`` on a fresh connection; with ``CONN_MAX_AGE`` connections
    are reused across requests), Django's ``is_usable`` health check (``SELECT 1`` on
    the raw connection, only after a database error), and anything sent on other
    connections or after the response has started (nothing, for the host API).

``X-Settle-SQL-Detail``
    The same count split up: ``statements=N begin=N commit=N rollback=N``, and
    ``cpu_us=N``: the CPU the worker's thread spent on the request until its answer
    was decided (Django's handler and the view; not gunicorn's reading and writing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from bench.sqlcount import StatementCount, counting
from harness.fleet.api import SQL_DETAIL_HEADER, SQL_HEADER
from settle.wsgi import application as django_application

_current = threading.local()


def _count() -> StatementCount | None:
    return getattr(_current, "count", None)


def _counting_this_thread() -> None:
    """Count on this thread's connection once; each request then swaps its own count in."""
    target = connections[DEFAULT_DB_ALIAS]
    if not getattr(target, "_settle_counting", False):
        counting(_count)
        target._settle_counting = True


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    count = StatementCount()
    _current.count = count
    _counting_this_thread()
    started = time.thread_time()

    def counting_start_response(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
        cpu_us = round((time.thread_time() - started) * 1e6)
        headers = [
            *headers,
            (SQL_HEADER, str(count.total)),
            (SQL_DETAIL_HEADER, f"{count.detail()} cpu_us={cpu_us}"),
        ]
        _current.count = None  # the response is decided: stop counting
        return start_response(status, headers, *exc)

    try:
        return django_application(environ, counting_start_response)
    finally:
        _current.count = None
