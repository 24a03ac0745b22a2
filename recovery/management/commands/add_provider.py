from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.models import Provider
from recovery.services.errors import RecoveryError
from recovery.services.providers import provider_configure


class Command(BaseCommand):
    help = "Create or update a provider and its adapter settings."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--adapter", required=True, choices=Provider.Adapter.values)
        parser.add_argument("--path", default="", help="sqlite file or journal file (absolute)")
        parser.add_argument(
            "--missing-ok",
            action="store_true",
            help="accept a --path with no file yet (the provider creates it before its first "
            "effect); by default a missing file is refused, as lookups could never read it",
        )
        parser.add_argument("--url", default="", help="base URL of the http provider")
        parser.add_argument(
            "--secret",
            default="",
            help="HMAC secret of the http provider; for mcp, its server as JSON: "
            '{"url": "https://…/mcp", "tool": "evidence", "bearer": "…"} (or "headers")',
        )
        parser.add_argument("--timeout-seconds", type=float, default=None)
        parser.add_argument(
            "--lease-seconds",
            type=int,
            default=None,
            help="how long a dispatch may go without heartbeat or result (default 60)",
        )
        parser.add_argument(
            "--lookup-budget",
            type=int,
            default=None,
            help="inconclusive lookups (absent/unavailable) before reconcile (default 5)",
        )
        parser.add_argument(
            "--absent-is-authoritative",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="the provider's record is complete: 'absent' evidence lets an operator void "
            "without a second operator (default off)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["path"]
        if path and os.path.isabs(path) and not options["missing_ok"] and not os.path.isfile(path):
            # The service takes any absolute path (a file may come later); a person typing
            # the command most likely mistyped it, and every lookup would then fail.
            raise CommandError(
                f"no file at {path}: give the path Settle's workers read the provider's "
                "record at, or --missing-ok if the provider creates it later"
            )
        try:
            provider, created = provider_configure(
                name=options["name"],
                adapter=options["adapter"],
                path=options["path"],
                url=options["url"],
                secret=options["secret"],
                timeout_seconds=options["timeout_seconds"],
                lease_seconds=options["lease_seconds"],
                lookup_budget=options["lookup_budget"],
                absent_is_authoritative=options["absent_is_authoritative"],
            )
        except RecoveryError as exc:
            raise CommandError(exc.message) from exc
        if provider.adapter == Provider.Adapter.MCP and not provider.secret:
            self.stdout.write(
                "no MCP server given (--secret): this provider has no evidence tool, so its "
                "uncertain operations go to an operator once the lookup budget is spent"
            )
        verb = "created" if created else "updated"
        self.stdout.write(
            f"{verb} provider {provider.name} ({provider.adapter}, lease "
            f"{provider.lease_seconds} s, timeout {provider.timeout_seconds} s)"
        )
