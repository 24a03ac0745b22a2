"""``manage.py benchmark_signatures``: verifying decisions signed with a passkey.

The measurement is ``bench/signatures.py``; this command only takes the options and passes
them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench.signatures import SignatureBenchmark


class Command(BaseCommand):
    help = (
        "Time the check of one signed decision, then verify_audit over N seeded events "
        "with none and with a share of them signed votes; the last line is JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=200_000)
        parser.add_argument(
            "--signed", type=float, default=0.1, help="the share of events that are signed votes"
        )
        parser.add_argument(
            "--repeat", type=int, default=2, help="verify_audit runs on each log (fastest kept)"
        )
        parser.add_argument(
            "--votes", type=int, default=2000, help="signed decisions checked one by one"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["events"] < 1 or not 0 < options["signed"] <= 1 or options["repeat"] < 1:
            raise CommandError("--events and --repeat at least 1, --signed in (0, 1]")
        SignatureBenchmark(self.stdout).run(
            events=options["events"],
            signed=options["signed"],
            repeat=options["repeat"],
            votes=max(1, options["votes"]),
        )
