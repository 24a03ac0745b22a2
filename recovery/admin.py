"""Django admin: providers and credentials are configured here or by management commands.

Evidence, dispatches, receipts and the audit log are shown read-only: they are records,
never edited by hand.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from approvals.admin import CredentialAdmin, ReadOnlyAdmin
from recovery.models import (
    AuditEvent,
    Dispatch,
    Evidence,
    Host,
    LookupAttempt,
    Operation,
    Provider,
)
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure


@admin.register(Host)
class HostAdmin(CredentialAdmin):
    create = host_create


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "adapter", "lease_seconds", "timeout_seconds", "lookup_budget"]
    fields = [
        "name",
        "adapter",
        "path",
        "url",
        "secret",
        "timeout_seconds",
        "lease_seconds",
        "lookup_budget",
    ]

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        provider, _ = provider_configure(
            name=obj.name,
            adapter=obj.adapter,
            path=obj.path,
            url=obj.url,
            secret=obj.secret,
            timeout_seconds=obj.timeout_seconds,
            lease_seconds=obj.lease_seconds,
            actor=f"user:{request.user.get_username()}",
        )
        Provider.objects.filter(pk=provider.pk).update(lookup_budget=obj.lookup_budget)
        obj.pk = provider.pk


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["key", "action", "provider", "state", "version", "recovered", "updated_at"]
    list_filter = ["state", "provider"]
    search_fields = ["key"]


for model in (Dispatch, Evidence, LookupAttempt):
    admin.site.register(model, ReadOnlyAdmin)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "at", "kind", "operation_key", "actor"]
    list_filter = ["kind"]
    search_fields = ["operation_key"]
