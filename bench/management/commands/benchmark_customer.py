"""``manage.py benchmark_customer``: the customer page's server time, tap to the
``approval.decided`` webhook, and an opening's statements with a party and without.

The measurement is ``bench/customer.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.customer import CustomerBenchmark


class Command(BaseCommand):
    help = "Measure customer approvals by link through gunicorn and a Celery worker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--approvals", type=int, default=100, help="taps measured")
        parser.add_argument("--pages", type=int, default=300, help="page loads measured")
        parser.add_argument("--keep", action="store_true", help="keep the scratch directory")

    def handle(self, *args: Any, **options: Any) -> None:
        CustomerBenchmark(self.stdout).run(**options)
