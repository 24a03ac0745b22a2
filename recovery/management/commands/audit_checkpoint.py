from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from recovery.audit import audit_checkpoint


class Command(BaseCommand):
    help = (
        "Sign a checkpoint of the audit chains that moved (run it every minute; the "
        "background worker will). Prints nothing new when nothing moved."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        checkpoint = audit_checkpoint()
        if checkpoint is None:
            self.stdout.write("nothing new to checkpoint")
        else:
            self.stdout.write(
                f"checkpoint #{checkpoint.number}: {len(checkpoint.heads)} chains, events up "
                f"to id {checkpoint.watermark}"
            )
