from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.audit import (
    VerifyTally,
    audit_checkpoint,
    audit_checkpoint_newest,
    audit_verification_run,
)


class Command(BaseCommand):
    help = (
        "Check every audit chain against its hashes and the signed checkpoints; name the "
        "first problem and exit non-zero. When all is intact, sign a new checkpoint."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-checkpoint", action="store_true", help="verify only; sign nothing new"
        )

    def handle(self, *args: Any, no_checkpoint: bool = False, **options: Any) -> None:
        tally = VerifyTally()
        verification = audit_verification_run(tally=tally)
        if not verification.ok:
            raise CommandError(f"audit log broken: {verification.problem}")
        if not no_checkpoint:
            audit_checkpoint()
        # What the verification counted: counting the log again would read it twice.
        self.stdout.write(f"audit log intact: {tally.events} events in {tally.chains} chains")
        checkpoint = audit_checkpoint_newest()
        if checkpoint is None:
            self.stdout.write("no checkpoint yet: nothing is signed")
        else:
            self.stdout.write(
                f"newest checkpoint #{checkpoint.number} signed at "
                f"{checkpoint.made_at:%Y-%m-%d %H:%M:%S} UTC, covering events up to "
                f"id {checkpoint.watermark}"
            )
