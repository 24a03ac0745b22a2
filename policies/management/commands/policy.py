from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.actors import COMMAND_LINE
from policies.policy_file import PolicyError, policy_parse
from policies.services import policy_apply, policy_diff, policy_source_current


class Command(BaseCommand):
    help = (
        "Approval policies: check FILE (reads it whole; names the line and the reason of "
        "the first mistake), apply FILE (shows the difference from the policy in force, "
        "then puts it in force, audited; --yes to apply without asking), show (the file "
        "in force)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("check").add_argument("file")
        apply = actions.add_parser("apply")
        apply.add_argument("file")
        apply.add_argument("--yes", action="store_true", help="apply without asking")
        actions.add_parser("show")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "show":
            current = policy_source_current()
            if not current:
                # A script that reads the file in force must not take silence for one.
                raise CommandError("no policy in force: every approval asks one person")
            self.stdout.write(current, ending="")
            return
        path = Path(options["file"])
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from exc
        try:
            policy = policy_parse(source)
        except PolicyError as exc:
            raise CommandError(f"{path}: {exc}") from exc
        if action == "check":
            self.stdout.write(
                f"{path}: {len(policy.rules)} rules, {len(policy.actions)} action summaries, "
                f"version {policy.version}"
            )
            return
        diff = policy_diff(source)
        if not diff:
            self.stdout.write(f"{path}: already in force ({policy.version})")
            return
        self.stdout.write(diff, ending="" if diff.endswith("\n") else "\n")
        if not options["yes"]:
            if not sys.stdin.isatty():
                raise CommandError("not applied: pass --yes to apply without a terminal")
            if input("Apply this policy? [y/N] ").strip().lower() not in ("y", "yes"):
                raise CommandError("not applied")
        applied, _ = policy_apply(source=source, actor=COMMAND_LINE)
        version = applied.version if applied is not None else policy.version
        self.stdout.write(f"applied {version}: {len(policy.rules)} rules")
