"""gunicorn's settings for Settle: ``gunicorn -c python:settle.gunicorn_conf settle.wsgi``.

The metrics directory's bookkeeping (``monitoring.metrics``): the master tidies the
files of processes that are gone when it starts, and drops a worker's live gauges when
that worker exits. And how many reads a worker may hold for an approval's decision
(``SETTLE_APPROVAL_WAITS``, unless set): half its ``--threads``, none for a one-thread
worker, whose one held read would stop it answering anything else. Everything else stays
on the command line.
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


def approval_waits(threads: int) -> int:
    """The reads a worker of ``threads`` threads holds for an approval's decision: half of
    them, so that the rest always answer; none for one thread."""
    return threads // 2


def post_worker_init(worker: Any) -> None:
    if "SETTLE_APPROVAL_WAITS" not in os.environ:
        from django.conf import settings

        settings.SETTLE_APPROVAL_WAITS = approval_waits(worker.cfg.threads)


def child_exit(server: Any, worker: Any) -> None:
    from monitoring.metrics import metrics_process_dead

    metrics_process_dead(worker.pid)
