"""Monitoring's own rows: queues' signs of life and the operation count snapshot.

One row per queue or (provider, state), updated in place, never per operation. The
core's own runs (the sweep's ``Pulse``, a provider's ``LookupPulse``) are recorded by
``recovery.services.runs``, where that work happens.
"""

from __future__ import annotations

import time

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from monitoring.models import OperationCount, QueuePulse
from recovery.models import Operation, Pulse
from recovery.services.runs import pulse_record


def queue_pulse_record(*, queue: str, waited: float) -> None:
    """A worker of ``queue`` ran its heartbeat just now, ``waited`` seconds after it was sent."""
    QueuePulse.objects.update_or_create(
        queue=queue, defaults={"at": timezone.now(), "waited": max(0.0, waited)}
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
