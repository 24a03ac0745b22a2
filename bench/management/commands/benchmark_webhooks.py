"""``manage.py benchmark_webhooks``: webhook deliveries per second, commit-to-receiver
latency, and a receiver that is down for a while.

The measurement is ``bench/webhooks.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.webhooks import WebhookBenchmark


class Command(BaseCommand):
    help = "Deliver webhooks with W Celery workers to a local receiver; print the figures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=5000, help="messages in the burst")
        parser.add_argument("--rate", type=int, default=200, help="changes a second, steady")
        parser.add_argument("--down-seconds", type=float, default=300.0)
        parser.add_argument(
            "--hanging", type=int, default=500, help="changes while an endpoint hangs"
        )
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--timeout", type=float, default=900.0)
        parser.add_argument("--keep", action="store_true", help="keep the scratch directory")

    def handle(self, *args: Any, **options: Any) -> None:
        WebhookBenchmark(self.stdout).run(**options)
