from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from approvals.models import Approval, Approver, Permit, PermitEvent
from approvals.services import approver_create


@admin.register(Approver)
class ApproverAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "created_at"]
    fields = ["name"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Approver, form: Any, change: bool) -> None:
        approver, token = approver_create(name=obj.name)
        obj.pk, obj.token_hash = approver.pk, approver.token_hash
        messages.warning(request, f"Token for {approver.name} (shown once): {token}")


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


for model in (Approval, Permit, PermitEvent):
    admin.site.register(model, ReadOnly)
