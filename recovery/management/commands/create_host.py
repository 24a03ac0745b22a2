from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.models import Host
from recovery.services.credentials import host_create


class Command(BaseCommand):
    help = "Create a host credential and print its bearer token (shown once, stored hashed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--display-name",
            default="",
            help="Who asks, as the host's customers read it on their approval page.",
        )

    def handle(self, *args: Any, name: str, display_name: str, **options: Any) -> None:
        if Host.objects.filter(name=name).exists():
            raise CommandError(f"a host named {name!r} already exists")
        if len(display_name) > 200:
            raise CommandError("the display name is at most 200 characters")
        _, token = host_create(name=name, display_name=display_name)
        self.stdout.write(token)
