"""``manage.py benchmark_policies``: what a policy of twenty rules costs an approval's
opening. The measurement is ``bench/policies.py``; this command only passes the options on."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from bench.policies import PolicyBenchmark


class Command(BaseCommand):
    help = "Time approval openings without a policy and with twenty rules and a budget."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--openings", type=int, default=300)

    def handle(self, *args: Any, **options: Any) -> None:
        PolicyBenchmark(self.stdout).run(**options)
