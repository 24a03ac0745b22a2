"""The few rows the health facts read, written where the work happens.

One row per job or provider, updated in place: a sweep writes one row, a lookup batch
one row per provider it read, the count snapshot one row per (provider, state). None of
them is written per operation, and none inside the transactions of the work itself (a
failure to record a pulse never undoes a sweep or a lookup).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from recovery.metrics import LOOKUPS
from recovery.models import (
    Operation,
    OperationCount,
    Provider,
    ProviderLookups,
    Pulse,
    QueuePulse,
    Verdict,
)

_LOOKUPS_TABLE = connection.ops.quote_name(ProviderLookups._meta.db_table)


def pulse_record(*, name: str, seconds: float, at: datetime | None = None) -> None:
    """``name`` finished just now (or ``at``), taking ``seconds``."""
    Pulse.objects.update_or_create(
        name=name, defaults={"at": at or timezone.now(), "seconds": seconds}
    )


def queue_pulse_record(*, queue: str, waited: float) -> None:
    """A worker of ``queue`` ran its heartbeat just now, ``waited`` seconds after it was sent."""
    QueuePulse.objects.update_or_create(
        queue=queue, defaults={"at": timezone.now(), "waited": max(0.0, waited)}
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


@transaction.atomic
def operation_counts_refresh() -> int:
    """Count the operations of every (provider, state) into ``OperationCount``; rows written.

    One grouped count over the ``operation_provider_state`` index, every few minutes by
    beat, so that /metrics never counts the table itself.
    """
    started = time.perf_counter()
    counts = {
        (row["provider_id"], row["state"]): row["count"]
        for row in Operation.objects.values("provider_id", "state")
        .annotate(count=Count("*"))
        .order_by()
    }
    existing = {(row.provider_id, row.state): row for row in OperationCount.objects.all()}
    gone = [row.pk for key, row in existing.items() if key not in counts]
    OperationCount.objects.filter(pk__in=gone).delete()
    OperationCount.objects.bulk_create(
        [
            OperationCount(provider_id=provider_id, state=state, count=count)
            for (provider_id, state), count in counts.items()
        ],
        update_conflicts=True,
        unique_fields=["provider", "state"],
        update_fields=["count"],
    )
    pulse_record(name=Pulse.Name.OPERATION_COUNTS, seconds=time.perf_counter() - started)
    return len(counts)
