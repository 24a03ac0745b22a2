"""When the core's work last ran: the rows monitoring's health facts read.

One row per job or provider, updated in place: a sweep writes one ``Pulse`` row, a
lookup batch one ``LookupPulse`` row per provider it read. Neither is written per
operation, nor inside the transactions of the work itself (a failure to record a pulse
never undoes a sweep or a lookup).

``Pulse`` stays in the core, as its table of "when did each periodic job last finish":
the sweep writes its row here, where it runs, and monitoring reads it without the core
importing monitoring. A separate sweep-only table would have the same two columns and
split one question ("when did each periodic job last run?") across two apps; beat and
monitoring's own count snapshot record their runs through the same ``pulse_record``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection
from django.utils import timezone

from recovery.metrics import LOOKUPS
from recovery.models import LookupPulse, Provider, Pulse, Verdict

_LOOKUPS_TABLE = connection.ops.quote_name(LookupPulse._meta.db_table)


def pulse_record(*, name: str, seconds: float, at: datetime | None = None) -> None:
    """``name`` finished just now (or ``at``), taking ``seconds``."""
    Pulse.objects.update_or_create(
        name=name, defaults={"at": at or timezone.now(), "seconds": seconds}
    )


def lookups_record(*, provider: Provider, verdicts: Iterable[str]) -> None:
    """A read of ``provider`` answered ``verdicts``: the counters and its lookups row.

    Lookups are failing while every answer is ``unavailable``; the first one that is not
    ends that (``unavailable_since`` cleared).
    """
    verdicts = list(verdicts)
    if not verdicts:
        return
    for verdict in verdicts:
        LOOKUPS.labels(provider=provider.name, verdict=verdict).inc()
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    available = any(verdict != Verdict.UNAVAILABLE for verdict in verdicts)
    # One statement, the row created by the first batch or updated by every later one
    # (PostgreSQL and SQLite alike): a lookup batch's statements stay the same every time.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {_LOOKUPS_TABLE}
                (provider_id, last_lookup_at, last_available_at, unavailable_since)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (provider_id) DO UPDATE SET
                last_lookup_at = excluded.last_lookup_at,
                last_available_at = COALESCE(
                    excluded.last_available_at, {_LOOKUPS_TABLE}.last_available_at
                ),
                unavailable_since = CASE WHEN excluded.last_available_at IS NULL
                    THEN COALESCE({_LOOKUPS_TABLE}.unavailable_since, excluded.unavailable_since)
                    END""",
            [provider.pk, now, now if available else None, None if available else now],
        )
