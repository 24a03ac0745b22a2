"""Django admin: providers and credentials are configured here or by management commands.

Evidence, dispatches, receipts and the audit log are shown read-only: they are records,
never edited by hand.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from approvals.actors import Actor
from approvals.admin import ApproverAdmin, CredentialAdmin, ReadOnlyAdmin
from approvals.models import Approver
from recovery.models import (
    AlertRule,
    AlertState,
    AuditEvent,
    Dispatch,
    Evidence,
    Host,
    LookupAttempt,
    Operation,
    Provider,
)
from recovery.services.alerts import alert_rule_delete, alert_rule_save, apprise_url_valid
from recovery.services.credentials import credential_disable, credential_rotate, host_create
from recovery.services.errors import Invalid
from recovery.services.providers import ProviderSettings, provider_save, provider_settings_check


@admin.register(Host)
class HostAdmin(CredentialAdmin):
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
        help_text="Write-only. Leave blank to keep the current secret.",
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


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "at", "kind", "operation_key", "actor"]
    list_filter = ["kind"]
    search_fields = ["operation_key"]


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders a value, not even the one just submitted."""

    def format_value(self, value: Any) -> str | None:
        return None


class AlertRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    """An alert rule; its Apprise URLs carry channel secrets: set or replaced, never shown."""

    new_urls = forms.CharField(
        label="Apprise URLs",
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 3, "autocomplete": "off"}),
        help_text=(
            "One per line (slack://…, mailto://…, msteams://…, json://host/path, …). "
            "Write-only: leave blank to keep the current ones."
        ),
    )

    class Meta:
        model = AlertRule
        fields = ["name", "provider", "kind", "threshold", "window_minutes", "enabled"]

    def clean_new_urls(self) -> str:
        urls = [line.strip() for line in self.cleaned_data["new_urls"].splitlines()]
        urls = [url for url in urls if url]
        if not urls and not (self.instance.pk and self.instance.urls):
            raise forms.ValidationError("At least one Apprise URL is needed.", code="required")
        for number, url in enumerate(urls, start=1):
            if not apprise_url_valid(url):
                # Not the URL itself: it may hold a secret, and errors are shown back.
                raise forms.ValidationError(
                    f"Apprise cannot send to URL {number}.", code="invalid_url"
                )
        return "\n".join(urls)

    def save(self, commit: bool = True) -> AlertRule:
        rule: AlertRule = super().save(commit=False)
        if self.cleaned_data["new_urls"]:
            rule.urls = self.cleaned_data["new_urls"]
        if commit:
            rule.save()
        return rule


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = AlertRuleForm
    list_display = ["name", "kind", "provider", "threshold", "window_minutes", "enabled"]
    list_filter = ["kind", "enabled"]
    fields = ["name", "provider", "kind", "threshold", "new_urls", "window_minutes", "enabled"]

    # Rules change only through their services: who silenced or redirected an alert is
    # on the audit log.
    def save_model(self, request: HttpRequest, obj: AlertRule, form: Any, change: bool) -> None:
        alert_rule_save(
            rule=obj,
            urls_replaced=bool(form.cleaned_data.get("new_urls")),
            actor=Actor.of("user", request.user),
        )

    def delete_model(self, request: HttpRequest, obj: AlertRule) -> None:
        alert_rule_delete(rule_id=obj.pk, actor=Actor.of("user", request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AlertRule]) -> None:
        for rule_id in queryset.values_list("pk", flat=True):
            alert_rule_delete(rule_id=rule_id, actor=Actor.of("user", request.user))


@admin.register(AlertState)
class AlertStateAdmin(ReadOnlyAdmin):
    list_display = ["rule", "firing_since", "last_sent_at", "resolved_at", "evaluated_at"]
