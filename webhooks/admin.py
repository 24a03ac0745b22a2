"""Django admin for webhook endpoints (added, rotated, disabled through their audited
services; secrets write-only) and their messages (read-only)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from common.actors import Actor
from common.admin import ReadOnlyAdmin
from recovery.services.errors import Invalid, RecoveryError
from webhooks.endpoints import (
    endpoint_events,
    webhook_endpoint_add,
    webhook_endpoint_disable,
    webhook_endpoint_rotate,
    webhook_url_addresses,
)
from webhooks.models import WebhookEndpoint, WebhookEvent, WebhookMessage, webhook_url_redacted
from webhooks.selectors import CONFIGURE_PERMISSION


class WebhookEndpointForm(forms.ModelForm):  # type: ignore[type-arg]
    """A new endpoint: its host, URL and events; the secret is made, and shown once."""

    event_types = forms.MultipleChoiceField(
        choices=WebhookEvent.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None chosen: every event.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["host", "url"]

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"]
        try:
            webhook_url_addresses(url)
        except Invalid as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from exc
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Endpoints change only through their services (audited); secrets are write-only."""

    form = WebhookEndpointForm
    list_display = ["id", "host", "url", "status", "failures", "subscribed", "created_at"]
    list_filter = ["status"]
    actions = ["rotate", "disable", "enable"]

    @admin.display(description="events")
    def subscribed(self, obj: WebhookEndpoint) -> str:
        return ", ".join(endpoint_events(obj)) if obj.events else "all"

    @admin.display(description="URL")
    def url_redacted(self, obj: WebhookEndpoint) -> str:
        return webhook_url_redacted(obj.url)

    def _url_field(self, request: HttpRequest) -> str:
        # A URL may carry a token: in full only to who may configure endpoints.
        return "url" if request.user.has_perm(CONFIGURE_PERMISSION) else "url_redacted"

    def get_list_display(self, request: HttpRequest) -> Any:
        url = self._url_field(request)
        return [url if name == "url" else name for name in self.list_display]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["host", "url", "event_types"]
        url = self._url_field(request)
        return ["host", url, "subscribed", "status", "failures", "disabled_reason"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else self.get_fields(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its deliveries refer to it: disable instead

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            return
        try:
            created, secret = webhook_endpoint_add(
                host_name=obj.host.name,
                url=obj.url,
                events=form.cleaned_data.get("event_types") or [],
                actor=Actor.of("user", request.user),
            )
        except RecoveryError as exc:
            messages.error(request, f"Not added: {exc.message}")
            return
        obj.pk = created.pk
        messages.warning(
            request, f"Signing secret for endpoint {created.pk} (shown once): {secret}"
        )

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        return actions if request.user.has_perm(CONFIGURE_PERMISSION) else {}

    @admin.action(
        description="Rotate the selected endpoints' secrets (old one kept for a grace period)"
    )
    def rotate(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            secret = webhook_endpoint_rotate(
                endpoint_id=endpoint.pk, actor=Actor.of("user", request.user)
            )
            messages.warning(
                request, f"New secret for endpoint {endpoint.pk} (shown once): {secret}"
            )

    @admin.action(description="Disable the selected endpoints")
    def disable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_endpoint_disable(
                endpoint_id=endpoint.pk, actor=Actor.of("user", request.user), reason="admin"
            )

    @admin.action(description="Enable the selected endpoints again")
    def enable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhook_endpoint_disable(
                endpoint_id=endpoint.pk, actor=Actor.of("user", request.user), disabled=False
            )


@admin.register(WebhookMessage)
class WebhookMessageAdmin(ReadOnlyAdmin):
    list_display = ["msg_id", "endpoint", "event", "status", "attempts", "last_status_code"]
    list_filter = ["status", "event"]
    exclude = ["payload"]
