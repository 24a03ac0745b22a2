from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.http import HttpRequest

from approvals.models import Approval, Approver, Permit, PermitEvent
from approvals.services import approver_create


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Records (permits, evidence, audit) are shown, never added, edited or deleted."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class CredentialAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Adding a credential calls its service, which shows the bearer token exactly once."""

    list_display = ["name", "created_at"]
    fields = ["name"]
    create: Callable[..., tuple[models.Model, str]]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        created, token = type(self).create(name=obj.name)
        obj.pk, obj.token_hash = created.pk, getattr(created, "token_hash", "")
        messages.warning(request, f"Token for {obj.name} (shown once): {token}")


@admin.register(Approver)
class ApproverAdmin(CredentialAdmin):
    create = approver_create


for model in (Approval, Permit, PermitEvent):
    admin.site.register(model, ReadOnlyAdmin)
