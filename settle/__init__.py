"""The Django project: settings, URLs, the Celery app, WSGI and ASGI, gunicorn's config.

Wiring only, above every app: ``DJANGO_SETTINGS_MODULE=settle.settings``, ``celery -A
settle``, ``gunicorn settle.wsgi``. No app imports it. The Celery app is made here, on the
project's first import, so that every ``shared_task`` binds to it.
"""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ["celery_app"]
