"""The audit log in the admin: read-only, as every record is."""

from __future__ import annotations

from django.contrib import admin

from audit.models import AuditEvent
from common.admin import ReadOnlyAdmin


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "at", "kind", "operation_key", "actor"]
    list_filter = ["kind"]
    search_fields = ["operation_key"]
