"""``manage.py verify_export FILE``: check an audit export without the database.

The trailer (the file is whole), every event's hash and the links between consecutive
events, and every signed decision against the passkey its system chain registered
(``audit.exported``). Exits non-zero, naming the first problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.exported import ExportTally, export_records, export_verify
from console.services.audit_export import EXPORT_FORMATS, export_file_check


class Command(BaseCommand):
    help = (
        "Check an audit export (CSV or JSON Lines) offline: its trailer, every event's "
        "hash and link, and every decision signed with a passkey."
    )
    # Reads a file; the database is neither needed nor touched.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument(
            "--format", choices=EXPORT_FORMATS, help="default: from the file's suffix"
        )

    def handle(self, *args: Any, path: Path, format: str | None = None, **options: Any) -> None:
        export_format = format or path.suffix.lstrip(".")
        if export_format not in EXPORT_FORMATS:
            raise CommandError(f"say --format: one of {', '.join(EXPORT_FORMATS)}")
        whole = export_file_check(path=path)
        if not whole.complete:
            raise CommandError(f"export incomplete: {whole.problem}")
        tally = ExportTally()
        with path.open(encoding="utf-8", newline="") as lines:
            problem = export_verify(export_records(lines, export_format), tally=tally)
        if problem is not None:
            raise CommandError(f"export broken: {problem}")
        self.stdout.write(
            f"export intact: {tally.events} events, {tally.signed_votes} signed decisions verified"
        )
