"""``manage.py benchmark_metrics``: one /metrics scrape's time at a million operations.

The measurement is ``bench/metrics.py``, a development tool that a runtime install need
not have; this command only takes the options and passes them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Time /metrics scrapes over N operations in a scratch database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=1_000_000)
        parser.add_argument("--providers", type=int, default=4)
        parser.add_argument("--scrapes", type=int, default=50)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from bench.metrics import MetricsBenchmark
        except ModuleNotFoundError as exc:
            if exc.name not in {"bench", "bench.metrics"}:
                raise
            raise CommandError(
                "benchmark_metrics needs bench/ (a development tool, not part of a runtime "
                "install): run it from a checkout, as `python manage.py benchmark_metrics`"
            ) from None
        MetricsBenchmark(self.stdout).run(**options)
