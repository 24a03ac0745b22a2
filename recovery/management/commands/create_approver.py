from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.models import Approver
from approvals.services import approver_create


class Command(BaseCommand):
    help = "Create an approver credential and print its bearer token (shown once, stored hashed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        if Approver.objects.filter(name=name).exists():
            raise CommandError(f"an approver named {name!r} already exists")
        _, token = approver_create(name=name)
        self.stdout.write(token)
