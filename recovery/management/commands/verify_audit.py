from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.audit import audit_checkpoint, audit_status, audit_verification_run


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
        verification = audit_verification_run()
        if not verification.ok:
            raise CommandError(f"audit log broken: {verification.problem}")
        if not no_checkpoint:
            audit_checkpoint()
        status = audit_status()
        self.stdout.write(f"audit log intact: {status.events} events in {status.chains} chains")
        if status.checkpoint is None:
            self.stdout.write("no checkpoint yet: nothing is signed")
        else:
            self.stdout.write(
                f"newest checkpoint #{status.checkpoint.number} signed at "
                f"{status.checkpoint.made_at:%Y-%m-%d %H:%M:%S} UTC, covering events up to "
                f"id {status.checkpoint.watermark}"
            )
