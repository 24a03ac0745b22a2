"""Django admin: providers and credentials are configured here or by management commands.

Evidence, dispatches, receipts and the audit log are shown read-only: they are records,
never edited by hand.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from approvals.admin import ApproverAdmin, CredentialAdmin
from approvals.models import Approver
from common.actors import Actor
from common.admin import ReadOnlyAdmin
from recovery.models import (
    Dispatch,
    Evidence,
    Host,
    LookupAttempt,
    Operation,
    Provider,
)
from recovery.services.credentials import credential_disable, credential_rotate, host_create
from recovery.services.errors import Invalid
from recovery.services.providers import ProviderSettings, provider_save, provider_settings_check


@admin.register(Host)
class HostAdmin(CredentialAdmin):
    list_display = ["name", "display_name", "active", "created_at", "disabled_at"]
    fields = ["name", "display_name"]
    create = host_create
    kind = "host"
    disable_service = credential_disable
    rotate_service = credential_rotate


# Approvers' lifecycle is audited here, where the audit log lives.
ApproverAdmin.disable_service = credential_disable
ApproverAdmin.rotate_service = credential_rotate
admin.site.register(Approver, ApproverAdmin)


class ProviderForm(forms.ModelForm):  # type: ignore[type-arg]
    """The provider's settings; its secret can be set or replaced, never read back."""

    new_secret = forms.CharField(
        label="Secret",
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False),
        help_text=(
            "Write-only. Leave blank to keep the current secret. An http provider's HMAC "
            'secret; an mcp provider\'s server as JSON: {"url": "https://…/mcp", '
            '"tool": "evidence", "bearer": "…"} (or "headers": {…} instead of "bearer").'
        ),
    )

    class Meta:
        model = Provider
        fields = ["name", "adapter", "path", "url", "timeout_seconds", "lease_seconds"]
        fields += ["lookup_budget", "absent_is_authoritative"]

    def settings(self) -> ProviderSettings:
        data = self.cleaned_data
        return ProviderSettings(
            name=data["name"],
            adapter=data["adapter"],
            path=data.get("path") or "",
            url=data.get("url") or "",
            secret=data.get("new_secret") or None,
            timeout_seconds=data.get("timeout_seconds"),
            lease_seconds=data.get("lease_seconds"),
            lookup_budget=data.get("lookup_budget"),
            absent_is_authoritative=data.get("absent_is_authoritative"),
        )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            has_secret = bool(self.instance.pk and self.instance.secret)
            try:
                provider_settings_check(self.settings(), has_secret=has_secret)
            except Invalid as exc:
                raise forms.ValidationError(exc.message, code=exc.code) from exc
        return cleaned


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Providers change only through ``provider_save``: audited, renames included."""

    form = ProviderForm
    list_display = ["name", "adapter", "lease_seconds", "timeout_seconds", "lookup_budget"]
    # ``secret`` is in no form and no read-only view: not even staff see it.
    provider_fields = [
        "name",
        "adapter",
        "path",
        "url",
        "new_secret",
        "timeout_seconds",
        "lease_seconds",
        "lookup_budget",
        "absent_is_authoritative",
    ]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if not self.has_change_permission(request, obj):
            return [field for field in self.provider_fields if field != "new_secret"]
        return list(self.provider_fields)

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        provider, _ = provider_save(
            provider_id=obj.pk if change else None,
            settings=form.settings(),
            actor=Actor.of("user", request.user),
        )
        obj.pk = provider.pk
        obj.refresh_from_db()


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["key", "action", "provider", "state", "version", "recovered", "updated_at"]
    list_filter = ["state", "provider"]
    search_fields = ["key"]


for model in (Dispatch, Evidence, LookupAttempt):
    admin.site.register(model, ReadOnlyAdmin)
