from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.actors import COMMAND_LINE
from recovery.services.credentials import KINDS, credential_disable, credential_rotate
from recovery.services.errors import RecoveryError


class Command(BaseCommand):
    help = (
        "Disable, enable or rotate a host's or approver's token. Takes effect on the "
        "credential's next request; audited. Rotating prints the new token (shown once)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["disable", "enable", "rotate"])
        parser.add_argument("kind", choices=sorted(KINDS))
        parser.add_argument("name")

    def handle(self, *args: Any, action: str, kind: str, name: str, **options: Any) -> None:
        actor = COMMAND_LINE
        try:
            if action == "rotate":
                self.stdout.write(credential_rotate(kind=kind, name=name, actor=actor))
                return
            credential_disable(kind=kind, name=name, actor=actor, disabled=action == "disable")
        except RecoveryError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{kind} {name} {action}d")
