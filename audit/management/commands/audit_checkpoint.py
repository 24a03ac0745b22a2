from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.checkpoint_file import CheckpointFileError
from audit.checkpoints import audit_checkpoint


class Command(BaseCommand):
    help = (
        "Sign a checkpoint of the audit chains that moved (run it every minute; the "
        "background worker will). Prints nothing new when nothing moved."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            checkpoint = audit_checkpoint()
        except CheckpointFileError as exc:
            raise CommandError(
                f"checkpoint signed, but not in the checkpoint file: {exc} (an alarm is open; "
                "the next checkpoint writes the lines the file lacks)"
            ) from None
        if checkpoint is None:
            self.stdout.write("nothing new to checkpoint")
        else:
            self.stdout.write(
                f"checkpoint #{checkpoint.number}: {len(checkpoint.heads)} chains, events up "
                f"to id {checkpoint.watermark}"
            )
