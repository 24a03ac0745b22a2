from __future__ import annotations

import os

from celery.signals import worker_process_init
from django.apps import AppConfig

from bench.sqlcount import worker_process_counting


class BenchConfig(AppConfig):
    """The benchmarks' commands (``manage.py benchmark_*``), in a checkout only."""

    name = "bench"
    verbose_name = "Benchmarks"

    def ready(self) -> None:
        # benchmark_recovery's workers count their SQL; ready() runs before the pool forks.
        if os.environ.get("SETTLE_SQL_COUNT_DIR"):
            worker_process_init.connect(worker_process_counting, weak=False)
