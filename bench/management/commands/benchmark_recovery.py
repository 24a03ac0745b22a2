"""``manage.py benchmark_recovery``: how fast background recovery drains a crash storm.

The measurement is ``bench/recovery.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.recovery import RecoveryBenchmark


class Command(BaseCommand):
    help = "Drain N stranded operations with W Celery workers; compare with one-at-a-time resume."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=1000)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument(
            "--resume-operations",
            type=int,
            default=0,
            help="how many to settle one at a time (default: --operations)",
        )
        parser.add_argument("--timeout", type=float, default=900.0)
        parser.add_argument("--keep", action="store_true", help="keep the scratch directory")

    def handle(self, *args: Any, **options: Any) -> None:
        RecoveryBenchmark(self.stdout).run(**options)
