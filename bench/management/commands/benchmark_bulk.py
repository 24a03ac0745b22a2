"""``manage.py benchmark_bulk``: how fast a bulk confirm of N matched operations goes.

The measurement is ``bench/bulk.py``; this command only takes the options and passes them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.bulk import BulkBenchmark


class Command(BaseCommand):
    help = "Confirm N matched operations in one bulk batch with W Celery workers; items/s."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=10000)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--timeout", type=float, default=900.0)
        parser.add_argument("--keep", action="store_true", help="keep the scratch directory")

    def handle(self, *args: Any, **options: Any) -> None:
        BulkBenchmark(self.stdout).run(**options)
