"""Which database errors are an outage or a bound, not a bug: the database is unreachable
(restarting, the connection was cut) or a statement ran past its timeout. Either is worth
a retry, so the web answers them 503 ``database_unavailable``, never a 500."""

from __future__ import annotations

from django.db import DatabaseError, InterfaceError, OperationalError

# SQLSTATEs of a statement that a bound cut: statement_timeout (query_canceled) and
# lock_timeout (lock_not_available).
TIMEOUT_SQLSTATES = frozenset({"57014", "55P03"})


def database_unavailable(exc: BaseException) -> str | None:
    """What to tell the caller when ``exc`` is an outage or a bound; None otherwise."""
    if not isinstance(exc, DatabaseError):
        return None
    if getattr(exc.__cause__, "sqlstate", None) in TIMEOUT_SQLSTATES:
        return "the database did not answer in time; retry"
    if isinstance(exc, OperationalError | InterfaceError):
        return "the database is unavailable; retry"
    return None
