from __future__ import annotations

import os
from pathlib import Path

from celery import Celery
from celery.signals import task_postrun, worker_init, worker_process_init, worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("settle")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _statements_counted(**_: object) -> None:
    """With ``SETTLE_SQL_COUNT_DIR`` set (benchmarks only), count each pool process's SQL."""
    directory = os.environ.get("SETTLE_SQL_COUNT_DIR")
    if not directory:
        return
    from recovery.sqlcount import StatementCount, count_file_write, counting

    count = StatementCount()
    counting(count)

    def _written(**_: object) -> None:
        count_file_write(Path(directory), count)

    task_postrun.connect(_written, weak=False)


worker_process_init.connect(_statements_counted, weak=False)


def _metrics_dir_tidied(**_: object) -> None:
    """The worker's main process, starting: remove the metrics files of dead processes."""
    from recovery.metrics import metrics_dir_tidy

    metrics_dir_tidy()


def _metrics_process_dead(**_: object) -> None:
    """A pool process exiting: prometheus-client's bookkeeping for its live gauges."""
    from recovery.metrics import metrics_process_dead

    metrics_process_dead(os.getpid())


worker_init.connect(_metrics_dir_tidied, weak=False)
worker_process_shutdown.connect(_metrics_process_dead, weak=False)
