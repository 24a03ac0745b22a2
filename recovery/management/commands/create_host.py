from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.models import Host
from recovery.services.credentials import host_create


class Command(BaseCommand):
    help = "Create a host credential and print its bearer token (shown once, stored hashed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        if Host.objects.filter(name=name).exists():
            raise CommandError(f"a host named {name!r} already exists")
        _, token = host_create(name=name)
        self.stdout.write(token)
