from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Celery, bootsteps
from celery.signals import (
    after_task_publish,
    beat_init,
    worker_init,
    worker_process_shutdown,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")

logger = logging.getLogger(__name__)

app = Celery("settle")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _metrics_dir_tidied(**_: object) -> None:
    """The worker's main process, starting: remove the metrics files of dead processes."""
    from monitoring.metrics import metrics_dir_tidy

    metrics_dir_tidy()


def _metrics_process_dead(**_: object) -> None:
    """A pool process exiting: prometheus-client's bookkeeping for its live gauges."""
    from monitoring.metrics import metrics_process_dead

    metrics_process_dead(os.getpid())


worker_init.connect(_metrics_dir_tidied, weak=False)
worker_process_shutdown.connect(_metrics_process_dead, weak=False)


# -- signs of life, written by the processes themselves (judged by /livez) ----------------

SWEEP_TASK = "recovery.tasks.sweep"
HEARTBEAT_TASK = "monitoring.tasks.worker_heartbeat"


def _beat_published(sender: str | None = None, **_: object) -> None:
    """Beat published a sweep: beat's pulse, written by beat, whatever the workers do."""
    if sender != SWEEP_TASK:
        return
    from django.db import close_old_connections

    from recovery.models import Pulse
    from recovery.services.runs import pulse_record

    # Beat has no request cycle to drop a connection the database closed.
    close_old_connections()
    try:
        pulse_record(name=Pulse.Name.BEAT, seconds=0.0)
    except Exception:  # a pulse lost must never stop beat's schedule
        logger.exception("beat: recording its pulse failed")


def _beat_started(**_: object) -> None:
    """Only beat records its publishes: the web processes and workers publish too."""
    after_task_publish.connect(_beat_published, weak=False)


beat_init.connect(_beat_started, weak=False)


class QueueHeartbeat(bootsteps.StartStopStep):
    """Every ``SETTLE_WORKER_HEARTBEAT_SECONDS``, publish a heartbeat to each queue this
    worker consumes; whichever worker of the queue runs it records the queue's pulse.

    Published by the worker itself, not by beat, so that a dead beat does not make live
    workers look silent; run through the queue, so that a worker whose pool is stuck, or
    a queue nobody consumes, does look silent.
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None

    def start(self, parent: Any) -> None:
        from django.conf import settings

        queues = sorted(queue.name for queue in parent.task_consumer.queues)
        expires = float(settings.SETTLE_LIVENESS_WORKER_SECONDS)

        def publish() -> None:
            for queue in queues:
                try:
                    parent.app.send_task(
                        HEARTBEAT_TASK, args=[queue, time.time()], queue=queue, expires=expires
                    )
                except Exception:  # the broker is away: the queue's pulse goes stale
                    logger.warning("worker: the heartbeat to %s was not published", queue)

        publish()
        self.timer_entry = parent.timer.call_repeatedly(
            float(settings.SETTLE_WORKER_HEARTBEAT_SECONDS), publish
        )

    def stop(self, parent: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None


app.steps["consumer"].add(QueueHeartbeat)
