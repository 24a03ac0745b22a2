"""Django admin: alert rules, set by operators, and their state, read-only.

A rule's Apprise URLs carry channel secrets: written, never shown back. Rules change
only through ``alert_rule_save``/``alert_rule_delete``, which audit the change.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from common.actors import Actor
from common.admin import ReadOnlyAdmin
from common.notify import apprise_url_valid
from monitoring.models import AlertRule, AlertState
from monitoring.services.alerts import alert_rule_delete, alert_rule_save


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
