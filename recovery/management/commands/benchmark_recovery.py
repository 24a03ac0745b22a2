"""``manage.py benchmark_recovery``: how fast background recovery drains a crash storm.

The measurement is ``bench/recovery.py``, a development tool that a runtime install need
not have; this command only takes the options and passes them on. It imports ``bench``
when it runs, never when Django loads commands, so ``manage.py check`` works without it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


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
        try:
            from bench.recovery import RecoveryBenchmark
        except ModuleNotFoundError as exc:
            if exc.name not in {"bench", "bench.recovery"}:
                raise  # bench/ is there, but something it needs is not
            raise CommandError(
                "benchmark_recovery needs bench/ (a development tool, not part of a runtime "
                "install): run it from a checkout of the repository, in its top directory, "
                "as `python manage.py benchmark_recovery`"
            ) from None
        RecoveryBenchmark(self.stdout).run(**options)
