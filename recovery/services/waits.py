"""A host's request held until its operation's approval is decided (a long poll).

``GET /api/v1/operations/{key}?wait=N`` answers at once unless the operation awaits
approval; then it is held until the approval is decided (or expires, or the operation is
revoked), at most N seconds, and answers with the record as it is then.

On PostgreSQL the held request LISTENs on :data:`CHANNEL` on a connection of its own, and
the operation's table NOTIFYs it when a row leaves ``awaiting_approval`` (a trigger,
migration ``recovery.0005``): the answer comes at the decision's commit, with no reads in
between. Elsewhere (the embedded SQLite) it reads the state every :data:`POLL_SECONDS`.

A held request holds a web thread, so each process holds at most
``SETTLE_APPROVAL_WAITS`` at once (``settle.gunicorn_conf`` sets it from gunicorn's
``--threads``: half of them; none for one-thread workers); past that, the answer comes at
once and the host waits on its side.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

CHANNEL = "settle_decided"
POLL_SECONDS = 0.25

_lock = threading.Lock()
_held = 0


def waits_allowed() -> int:
    return int(settings.SETTLE_APPROVAL_WAITS)


def _slot() -> bool:
    global _held
    with _lock:
        if _held >= waits_allowed():
            return False
        _held += 1
        return True


def _slot_free() -> None:
    global _held
    with _lock:
        _held -= 1


def decision_wait(operation_id: int, seconds: float, awaiting: Callable[[], bool]) -> bool:
    """Wait at most ``seconds`` while ``awaiting()`` (the operation still awaits
    approval). False where this process holds its most waits already: nothing waited."""
    if not _slot():
        return False
    try:
        if connection.vendor == "postgresql":
            _notified(operation_id, time.monotonic() + seconds, awaiting)
        else:
            _polled(time.monotonic() + seconds, awaiting)
    finally:
        _slot_free()
    return True


def _notified(operation_id: int, deadline: float, awaiting: Callable[[], bool]) -> None:
    """Held until the NOTIFY; a listener that cannot connect or loses its connection ends
    the wait early (the read then answers as the operation is, or as the database lets
    it: never an error of the wait's own)."""
    try:
        _listened(operation_id, deadline, awaiting)
    except psycopg.Error as exc:  # the listener is psycopg's own connection, unwrapped
        logger.warning("a held read stopped waiting: its listener failed: %s", exc)


def _listened(operation_id: int, deadline: float, awaiting: Callable[[], bool]) -> None:
    """LISTEN first, then look: a decision committed in between is read, not missed."""
    listener = connection.get_new_connection(connection.get_connection_params())
    try:
        listener.autocommit = True
        listener.execute(f"LISTEN {CHANNEL}")
        if not awaiting():
            return
        wanted = str(operation_id)
        while (remaining := deadline - time.monotonic()) > 0:
            for note in listener.notifies(timeout=remaining, stop_after=1):
                if note.payload == wanted:
                    return
    finally:
        listener.close()


def _polled(deadline: float, awaiting: Callable[[], bool]) -> None:
    while awaiting() and (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(POLL_SECONDS, remaining))
