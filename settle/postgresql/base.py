"""Django's PostgreSQL backend, with a health check that costs no round trip.

A connection held across requests (``CONN_MAX_AGE``) is checked before a request
reuses it (``CONN_HEALTH_CHECKS``), so that a database restart costs no request a dead
connection. Django's check is a ``SELECT 1``: a round trip on every request. Between
requests an idle connection receives nothing unless the server has something to say,
and a server that ends the session (a restart, ``pg_terminate_backend``, an idle
timeout) says so before it closes the socket: so the socket is asked, without waiting,
whether anything arrived. Nothing did: the connection is as the last request left it.
Something did (or the socket cannot be asked): Django's own check decides.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


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
