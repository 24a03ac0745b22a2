"""gunicorn's settings for Settle: ``gunicorn -c python:settle.gunicorn_conf settle.wsgi``.

Only the metrics directory's bookkeeping (``monitoring.metrics``): the master tidies the
files of processes that are gone when it starts, and drops a worker's live gauges when
that worker exits. Everything else stays on the command line.
"""

from __future__ import annotations

import os
from typing import Any


def on_starting(server: Any) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")

    django.setup()
    from monitoring.metrics import metrics_dir_tidy

    metrics_dir_tidy()


def child_exit(server: Any, worker: Any) -> None:
    from monitoring.metrics import metrics_process_dead

    metrics_process_dead(worker.pid)
