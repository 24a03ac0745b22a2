from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from recovery.audit import audit_verify
from recovery.models import AuditEvent


class Command(BaseCommand):
    help = "Walk the audit hash chain; name the first broken event and exit non-zero."

    def handle(self, *args: Any, **options: Any) -> None:
        for broken in audit_verify():
            raise CommandError(f"audit chain broken at event #{broken.seq}: {broken.reason}")
        count = AuditEvent.objects.count()
        self.stdout.write(f"audit chain intact: {count} events")
