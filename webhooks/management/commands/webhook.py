from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.actors import COMMAND_LINE
from recovery.services.errors import RecoveryError
from webhooks.endpoints import (
    endpoint_events,
    webhook_endpoint_add,
    webhook_endpoint_disable,
    webhook_endpoint_rotate,
)
from webhooks.models import WebhookEndpoint


class Command(BaseCommand):
    help = (
        "Webhook endpoints of hosts: add HOST URL [--events a,b] (prints the whsec_ signing "
        "secret, shown once), list, rotate ID [--grace-hours N] (prints the new secret; the "
        "old one signs beside it until the grace ends), disable ID, enable ID. Audited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add")
        add.add_argument("host")
        add.add_argument("url")
        add.add_argument(
            "--events", default="", help="comma-separated event types (default: every one)"
        )
        actions.add_parser("list")
        rotate = actions.add_parser("rotate")
        rotate.add_argument("id", type=int)
        rotate.add_argument("--grace-hours", type=float, default=None)
        for name in ("disable", "enable"):
            actions.add_parser(name).add_argument("id", type=int)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        try:
            if action == "add":
                endpoint, secret = webhook_endpoint_add(
                    host_name=options["host"],
                    url=options["url"],
                    events=options["events"].split(","),
                    actor=COMMAND_LINE,
                )
                self.stdout.write(f"endpoint {endpoint.pk} added for {endpoint.host.name}")
                self.stdout.write(f"signing secret (shown once): {secret}")
            elif action == "list":
                self._list()
            elif action == "rotate":
                hours = options["grace_hours"]
                secret = webhook_endpoint_rotate(
                    endpoint_id=options["id"],
                    actor=COMMAND_LINE,
                    grace=None if hours is None else timedelta(hours=hours),
                )
                self.stdout.write(f"new signing secret (shown once): {secret}")
            else:
                endpoint = webhook_endpoint_disable(
                    endpoint_id=options["id"], actor=COMMAND_LINE, disabled=action == "disable"
                )
                self.stdout.write(f"endpoint {endpoint.pk} {endpoint.status}")
        except RecoveryError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc

    def _list(self) -> None:
        rows = WebhookEndpoint.objects.select_related("host").order_by("host__name", "id")
        for endpoint in rows:
            events = ",".join(endpoint_events(endpoint)) if endpoint.events else "all events"
            self.stdout.write(
                f"{endpoint.pk}\t{endpoint.host.name}\t{endpoint.status}\t{endpoint.url}\t{events}"
            )
