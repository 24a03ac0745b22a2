"""The queues' signs of life, written by the heartbeat task that a worker of the queue runs."""

from __future__ import annotations

import time

from monitoring.models import QueuePulse
from monitoring.tasks import worker_heartbeat


def test_the_heartbeat_task_records_its_queue_and_how_long_it_waited(db: None):
    worker_heartbeat.run("some-queue", time.time() - 4)
    pulse = QueuePulse.objects.get(queue="some-queue")
    assert 4 <= pulse.waited < 10
    worker_heartbeat.run("some-queue", time.time() + 60)  # another machine's clock ahead
    assert QueuePulse.objects.get(queue="some-queue").waited == 0
