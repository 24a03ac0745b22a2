"""The console's Celery tasks: the dashboard's refresh, audit exports (bulk work's are
``bulk.tasks``).

Thin, as the core's (``recovery.tasks``): each takes ids, calls one service, and is safe
to run twice. Delivery is at least once (``task_acks_late``): a redelivered or duplicated
message finds its work done or held by a live lease, and changes nothing.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from console.services.audit_export import audit_export_run
from console.services.dashboard import dashboard_refresh as dashboard_refresh_run


@shared_task
def dashboard_refresh() -> int:
    """Beat's refresh of the dashboard's rollup: the audit events since the last one, once."""
    return dashboard_refresh_run().counted


# An export of a large trail runs longer than the other tasks may: its own limits.
@shared_task(
    soft_time_limit=settings.SETTLE_AUDIT_EXPORT_SECONDS,
    time_limit=settings.SETTLE_AUDIT_EXPORT_SECONDS + 30,
)
def audit_export(export_id: str) -> str:
    export = audit_export_run(export_id=export_id)
    return "" if export is None else str(export.status)
