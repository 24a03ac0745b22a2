"""Django's PostgreSQL backend, with a health check that costs no round trip.

A connection held across requests (``CONN_MAX_AGE``) is checked before a request
reuses it (``CONN_HEALTH_CHECKS``), so that a database restart costs no request a dead
connection. Django's check is a ``SELECT 1``: a round trip on every request. Between
requests an idle connection receives nothing unless the server has something to say,
and a server that ends the session (a restart, ``pg_terminate_backend``, an idle
timeout) says so before it closes the socket: so the socket is asked, without waiting,
whether anything arrived. Nothing did: the connection is as the last request left it.
Something did (or the socket cannot be asked): Django's own check decides.

Where no event loop runs, it asks for one without the exception Django's guard raises
and catches (``_async_unsafe``).

It also lets psycopg keep the conversion of longer statements (``%s`` to ``$1``…, see
``CONVERSIONS_KEPT_UP_TO``), and read timestamps with psycopg's own loader
(``PsycopgTimestamps``).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
import select
from collections.abc import Callable
from typing import Any, cast

import psycopg
from django.core.exceptions import SynchronousOnlyOperation
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql import base
from psycopg import _queries, pq
from psycopg.adapt import Loader
from psycopg.pq import Format

# psycopg converts a statement's text once and keeps it (the last 128 texts), but only a
# text of at most 50 parameters and 4,096 bytes; anything longer it converts again on
# every call, against the ORM's INSERTs of many rows, whose texts rarely repeat. Here the
# longest texts repeat on every call: the events' INSERT that carries what rides with it
# (an approval's row, the transitions, the outbox: 51 parameters and more), once a
# lifecycle, converted anew at about 0.2 ms of the worker's CPU each time. A text of up
# to these bounds is kept (tests/recovery/test_statement_budget.py holds that no
# lifecycle's statement is converted anew).
CONVERSIONS_KEPT_UP_TO = {"MAX_CACHED_STATEMENT_PARAMS": 200, "MAX_CACHED_STATEMENT_LENGTH": 16384}
for _name, _bound in CONVERSIONS_KEPT_UP_TO.items():
    setattr(_queries, _name, max(getattr(_queries, _name), _bound))


# psycopg's own loader of a timestamptz's text: compiled, with psycopg[binary].
_TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
_PSYCOPG_LOADER = cast("type[Loader]", psycopg.adapters.get_loader(_TIMESTAMPTZ, Format.TEXT))


_IDLE = pq.TransactionStatus.IDLE


class PsycopgTimestamps:
    """psycopg's own timestamptz loader, in the shape Django's backend looks for.

    Django registers a loader of its own on every connection: a Python subclass of
    psycopg's pure-Python loader that sets each value's zone to the connection's. The
    compiled loader is then never used, and reading timestamps from their text in Python
    cost a host API lifecycle 5 % of its instructions (``bench/api_profile.py
    --instructions``: 16.9 M against 16.05 M). Where Django's zone is UTC (``USE_TZ``
    without a database ``TIME_ZONE``) the session's is UTC too (Django sets it), and
    psycopg's loader gives the same values, zone ``datetime.UTC`` included. Django reads
    ``timezone`` from the class to decide whether a cursor needs a loader of its own;
    psycopg makes the loader by calling the class.
    """

    format = _PSYCOPG_LOADER.format
    timezone = datetime.UTC

    def __new__(cls, oid: int, context: Any = None) -> Any:
        return _PSYCOPG_LOADER(oid, context)


def _async_unsafe(name: str) -> Callable[..., Any]:
    """``BaseDatabaseWrapper``'s method ``name`` (one Django's ``async_unsafe`` wraps)
    behind the same guard, asked the cheap way.

    Django's asks ``asyncio.get_running_loop()``, which raises where no loop runs, and
    catches that: on every request of a sync worker, several times (``ensure_connection``
    before each transaction and its end, ``commit``). ``asyncio._get_running_loop()``
    answers the same question, None for no loop, as asgiref and ``settle.locals`` ask it.

    Where something has put its own method on ``BaseDatabaseWrapper`` since (pytest-django
    blocks ``ensure_connection`` so outside tests marked for the database), that one is
    called, as it would be without this class.
    """
    django_own = getattr(BaseDatabaseWrapper, name)
    function = django_own.__wrapped__
    message = "You cannot call this from an async context - use a thread or sync_to_async."

    @functools.wraps(function)
    def inner(self: BaseDatabaseWrapper, *args: Any, **kwargs: Any) -> Any:
        current = getattr(BaseDatabaseWrapper, name)
        if current is not django_own:
            return current(self, *args, **kwargs)
        if asyncio._get_running_loop() is not None and not os.environ.get(
            "DJANGO_ALLOW_ASYNC_UNSAFE"
        ):
            raise SynchronousOnlyOperation(message)
        return function(self, *args, **kwargs)

    return inner


class DatabaseWrapper(base.DatabaseWrapper):
    ensure_connection = _async_unsafe("ensure_connection")
    commit = _async_unsafe("commit")

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if self.timezone == datetime.UTC:
            connection.adapters.register_loader(_TIMESTAMPTZ, PsycopgTimestamps)
        return connection

    def _commit(self) -> None:
        """``COMMIT`` in one libpq call, as ``dbsql.cursor`` runs the statements before it.

        psycopg's ``commit()`` drives a generator through its wait loop for it; where
        nothing watches (``DEBUG``'s log), no two-phase or pipeline is open and a
        transaction is, libpq's blocking ``PQexec`` does the same with less of the web
        process's CPU. Anything else: Django's and psycopg's own way.
        """
        held = self.connection
        if (
            held is None
            or self.queries_logged
            or held.autocommit
            or held._tpc is not None
            or held._pipeline is not None
        ):
            super()._commit()  # type: ignore[misc]  # django-stubs leave it out
            return None
        with self.wrap_database_errors:
            if held.pgconn.transaction_status == _IDLE:
                return None
            result = held.pgconn.exec_(b"COMMIT")
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.errors.error_from_result(result, encoding=held.pgconn._encoding)
        return None

    def _set_autocommit(self, autocommit: bool) -> None:
        """psycopg's ``autocommit`` setter, less its generator and wait loop.

        psycopg's setter drives a generator through its wait loop to check that no
        transaction is open, then records the mode: no statement is sent. A transaction
        (``atomic``) sets it twice. Where the session is idle and no pipeline is open,
        the mode is recorded here under psycopg's lock; anything else (a transaction
        open: psycopg's error) is psycopg's own way.
        """
        held = self.connection
        if held._pipeline is None and held.pgconn.transaction_status == _IDLE:
            with held.lock:
                held._autocommit = bool(autocommit)
            return
        super()._set_autocommit(autocommit)  # type: ignore[misc]  # django-stubs leave it out

    def is_usable(self) -> bool:
        held = self.connection
        if held is None or held.closed or held.broken:
            return False
        if held.info.transaction_status != _IDLE:
            return bool(super().is_usable())
        try:
            readable, _, _ = select.select([held.fileno()], [], [], 0)
        except (OSError, ValueError):
            return bool(super().is_usable())
        return not readable or bool(super().is_usable())
