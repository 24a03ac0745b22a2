"""``manage.py benchmark_audit``: verifying and checkpointing an audit log of N events.

The measurement is ``bench/audit.py``; this command only takes the options and passes them on.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench.audit import AuditBenchmark


class Command(BaseCommand):
    help = (
        "Seed N audit events into an empty database, then time the first checkpoint, the "
        "full verification job's slices, a routine checkpoint and verification, a backlog's "
        "checkpoint and a full verify_audit, with their peak memory; the last line is JSON."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=100_000)
        parser.add_argument(
            "--new", type=int, default=10_000, help="events new since the last checkpoint"
        )
        parser.add_argument(
            "--backlog",
            type=int,
            default=0,
            help="then this many more events before one checkpoint (a beat outage)",
        )
        parser.add_argument(
            "--no-one-go",
            action="store_true",
            help="leave out the full verify_audit in one go (the job's slices still run)",
        )
        parser.add_argument(
            "--reuse",
            action="store_true",
            help="measure the events an earlier seed left here instead of seeding",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["events"] < 1 or options["new"] < 1:
            raise CommandError("--events and --new must be at least 1")
        AuditBenchmark(self.stdout).run(
            events=options["events"],
            new=options["new"],
            backlog=options["backlog"],
            reuse=options["reuse"],
            one_go=not options["no_one_go"],
        )
