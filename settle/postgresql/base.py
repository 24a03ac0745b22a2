"""Django's PostgreSQL backend, with a health check that costs no round trip.

A connection held across requests (``CONN_MAX_AGE``) is checked before a request
reuses it (``CONN_HEALTH_CHECKS``), so that a database restart costs no request a dead
connection. Django's check is a ``SELECT 1``: a round trip on every request. Between
requests an idle connection receives nothing unless the server has something to say,
and a server that ends the session (a restart, ``pg_terminate_backend``, an idle
timeout) says so before it closes the socket: so the socket is asked, without waiting,
whether anything arrived. Nothing did: the connection is as the last request left it.
Something did (or the socket cannot be asked): Django's own check decides.

It also lets psycopg keep the conversion of longer statements (``%s`` to ``$1``…, see
``CONVERSIONS_KEPT_UP_TO``).
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import _queries, pq

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


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        held = self.connection
        if held is None or held.closed or held.broken:
            return False
        if held.info.transaction_status != pq.TransactionStatus.IDLE:
            return bool(super().is_usable())
        try:
            readable, _, _ = select.select([held.fileno()], [], [], 0)
        except (OSError, ValueError):
            return bool(super().is_usable())
        return not readable or bool(super().is_usable())
