"""``manage.py benchmark_sso``: Settle's own time in a single sign-on, and what a signed-in
page costs. The measurement is ``bench/sso.py``; this command only passes the options on."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.sso import SsoBenchmark


class Command(BaseCommand):
    help = "Time single sign-ons against the tests' own OpenID Connect provider."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sign-ins", type=int, default=30)

    def handle(self, *args: Any, **options: Any) -> None:
        SsoBenchmark(self.stdout).run(**options)
