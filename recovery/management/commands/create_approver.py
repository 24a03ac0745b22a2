from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.models import Approver
from approvals.services.approvers import approver_create
from approvals.services.errors import ApprovalError
from recovery.models import Host, Provider


class Command(BaseCommand):
    help = (
        "Create an approver credential scoped to providers (and optionally hosts), and print "
        "its bearer token (shown once, stored hashed)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--provider", action="append", default=[], help="a provider it may decide for"
        )
        parser.add_argument(
            "--host", action="append", default=[], help="only this host's operations"
        )
        parser.add_argument(
            "--all-providers", action="store_true", help="every provider (say it explicitly)"
        )

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        if Approver.objects.filter(name=name).exists():
            raise CommandError(f"an approver named {name!r} already exists")
        providers, hosts = options["provider"], options["host"]
        unknown = sorted(set(providers) - set(Provider.objects.values_list("name", flat=True)))
        unknown += sorted(set(hosts) - set(Host.objects.values_list("name", flat=True)))
        if unknown:
            raise CommandError(f"no provider or host named {', '.join(unknown)}")
        try:
            _, token = approver_create(
                name=name,
                providers=providers,
                hosts=hosts,
                all_providers=options["all_providers"],
            )
        except ApprovalError as exc:
            hint = "give --provider P (repeatable) or --all-providers"
            raise CommandError(f"{exc.message}: {hint}") from exc
        self.stdout.write(token)
