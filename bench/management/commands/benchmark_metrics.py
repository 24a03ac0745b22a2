"""``manage.py benchmark_metrics``: one /metrics scrape's time at a million operations.

The measurement is ``bench/metrics.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.metrics import MetricsBenchmark


class Command(BaseCommand):
    help = "Time /metrics scrapes over N operations in a scratch database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=1_000_000)
        parser.add_argument("--providers", type=int, default=4)
        parser.add_argument("--scrapes", type=int, default=50)

    def handle(self, *args: Any, **options: Any) -> None:
        MetricsBenchmark(self.stdout).run(**options)
