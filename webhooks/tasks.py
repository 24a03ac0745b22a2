"""Celery tasks of the webhooks: thin, as ``recovery.tasks``'s, and safe to run twice."""

from __future__ import annotations

from celery import shared_task

from webhooks.delivery import webhooks_deliver as webhooks_deliver_run


@shared_task
def webhooks_deliver(promote: bool = True) -> dict[str, int]:
    """Deliver the due webhook messages (beat; and, without ``promote``, a commit's nudge)."""
    report = webhooks_deliver_run(promote=promote)
    return {"delivered": report.delivered, "failed": report.failed, "deferred": report.deferred}
