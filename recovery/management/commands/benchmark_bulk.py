"""``manage.py benchmark_bulk``: how fast a bulk confirm of N matched operations goes.

The measurement is ``bench/bulk.py``, a development tool that a runtime install need not
have; this command only takes the options and passes them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Confirm N matched operations in one bulk batch with W Celery workers; items/s."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=10000)
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--timeout", type=float, default=900.0)
        parser.add_argument("--keep", action="store_true", help="keep the scratch directory")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from bench.bulk import BulkBenchmark
        except ModuleNotFoundError as exc:
            if exc.name not in {"bench", "bench.bulk"}:
                raise
            raise CommandError(
                "benchmark_bulk needs bench/ (a development tool, not part of a runtime "
                "install): run it from a checkout of the repository, in its top directory, "
                "as `python manage.py benchmark_bulk`"
            ) from None
        BulkBenchmark(self.stdout).run(**options)
