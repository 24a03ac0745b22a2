from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from approvals.models import (
    Approval,
    ApprovalNotice,
    Party,
    PartyEnrolment,
    PartyPasskey,
    Permit,
    PermitEvent,
)
from approvals.services.approvers import approver_create
from approvals.services.errors import ApprovalError
from approvals.services.parties import party_passkey_remove
from common.actors import Actor
from common.admin import ReadOnlyAdmin


class CredentialAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Credentials through their services: a token shown exactly once, disabled not deleted.

    ``create`` makes one and returns its token; ``lifecycle`` is the kind's name for the
    disable/enable/rotate service (set by the app that audits them).
    """

    list_display = ["name", "active", "created_at", "disabled_at"]
    fields = ["name"]
    actions = ["disable", "enable", "rotate"]
    create: Callable[..., tuple[models.Model, str]]
    kind: str
    disable_service: Callable[..., None]
    rotate_service: Callable[..., str]

    @admin.display(boolean=True)
    def active(self, obj: Any) -> bool:
        return bool(obj.active)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Actions change credentials: they need the model's change permission, which
        # ``has_change_permission`` withholds from the (read-only) form.
        actions = super().get_actions(request)
        codename = f"{self.opts.app_label}.change_{self.opts.model_name}"
        return actions if request.user.has_perm(codename) else {}

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # A form's other fields (a host's display name) are made with it, as given.
        named = [name for name in self.fields or () if isinstance(name, str)]
        more = {name: getattr(obj, name) for name in named if name != "name"}
        created, token = type(self).create(name=obj.name, **more)
        obj.pk, obj.token_hash = created.pk, getattr(created, "token_hash", "")
        messages.warning(request, f"Token for {obj.name} (shown once): {token}")

    def _actor(self, request: HttpRequest) -> Actor:
        return Actor.of("user", request.user)

    @admin.action(description="Disable the selected credentials (401 from their next request)")
    def disable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for credential in queryset:
            type(self).disable_service(
                kind=self.kind, name=credential.name, actor=self._actor(request)
            )
        messages.success(request, f"Disabled {queryset.count()} credential(s).")

    @admin.action(description="Enable the selected credentials again")
    def enable(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for credential in queryset:
            type(self).disable_service(
                kind=self.kind, name=credential.name, actor=self._actor(request), disabled=False
            )
        messages.success(request, f"Enabled {queryset.count()} credential(s).")

    @admin.action(description="Rotate the selected credentials' tokens (shown once)")
    def rotate(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for credential in queryset:
            token = type(self).rotate_service(
                kind=self.kind, name=credential.name, actor=self._actor(request)
            )
            messages.warning(request, f"New token for {credential.name} (shown once): {token}")


class ApproverAdmin(CredentialAdmin):
    """Registered by ``recovery.admin``, which audits the approvers' lifecycle."""

    create = approver_create
    kind = "approver"
    fields = ["name", "all_providers", "providers", "hosts"]
    list_display = ["name", "active", "all_providers", "providers", "hosts", "created_at"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        try:
            created, token = approver_create(
                name=obj.name,
                providers=list(obj.providers or []),
                hosts=list(obj.hosts or []),
                all_providers=obj.all_providers,
            )
        except ApprovalError as exc:
            messages.error(request, exc.message)
            return
        obj.pk, obj.token_hash = created.pk, created.token_hash
        messages.warning(request, f"Token for {obj.name} (shown once): {token}")


for model in (Approval, Permit, PermitEvent):
    admin.site.register(model, ReadOnlyAdmin)


@admin.register(Party)
class PartyAdmin(ReadOnlyAdmin):
    """A host's customers: who they are to the host, and where Settle may send links."""

    list_display = ["host", "party", "display_name", "created_at", "updated_at"]
    list_filter = ["host"]
    search_fields = ["party", "display_name"]


@admin.register(ApprovalNotice)
class ApprovalNoticeAdmin(ReadOnlyAdmin):
    """Where an approval's messages stand: a send Apprise refused shows its error here."""

    list_display = ["approval", "kind", "tag", "status", "created_at", "sent_at", "attempts"]
    list_filter = ["status", "kind", "tag"]
    readonly_fields = ["send_error"]


@admin.register(PartyEnrolment)
class PartyEnrolmentAdmin(ReadOnlyAdmin):
    """Enrolment links: when asked for, by whom, until when, and when used (never the token)."""

    list_display = ["party", "requested_by", "created_at", "expires_at", "used_at"]
    exclude = ["token_hash"]


@admin.register(PartyPasskey)
class PartyPasskeyAdmin(ReadOnlyAdmin):
    """A customer's passkeys; staff revoke one with the action (audited, as a host's revoke).

    Revoking needs the change permission on customer passkeys
    (``approvals.change_partypasskey``, a superuser's, or a group's it is granted to): the
    passkey's owner is a host's customer, of no one provider.
    """

    list_display = ["party", "name", "credential_id", "created_at", "removed_at", "removed_by"]
    list_filter = ["party__host"]
    exclude = ["public_key"]
    actions = ["revoke"]

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        return actions if request.user.has_perm("approvals.change_partypasskey") else {}

    @admin.action(description="Revoke the selected passkeys (they sign nothing from now on)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actor = Actor.of("user", request.user)
        removed = 0
        for passkey in queryset.select_related("party"):
            _, changed = party_passkey_remove(
                party=passkey.party, passkey_id=passkey.pk, actor=actor
            )
            removed += changed
        messages.success(request, f"Revoked {removed} passkey(s).")
