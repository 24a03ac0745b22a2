"""``manage.py benchmark_console``: the console's pages over N seeded operations.

The measurement is ``bench/console.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench.console import ConsoleBenchmark


class Command(BaseCommand):
    help = (
        "Seed N operations into an empty database, then time the console's pages (p50, "
        "p95, SQL statements) beside the admin's change list; the last line is JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--operations", type=int, default=10_000)
        parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
        parser.add_argument(
            "--reuse",
            action="store_true",
            help="measure the operations an earlier run seeded here instead of seeding",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["operations"] < 1 or options["requests"] < 1:
            raise CommandError("--operations and --requests must be at least 1")
        ConsoleBenchmark(self.stdout).run(
            operations=options["operations"], requests=options["requests"], reuse=options["reuse"]
        )
