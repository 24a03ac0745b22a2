"""Beat's work for sign-in: clearing sessions that have ended."""

from __future__ import annotations

from celery import shared_task

from identity.sessions import sessions_expired_clear


@shared_task
def sessions_clear() -> tuple[int, int]:
    return sessions_expired_clear()
