"""Passkeys in the administration: where a superuser removes a lost one.

allauth's own admin would let a row be added or its credential edited (another public
key, unrecorded) and removes rows without its signal. Here passkeys are only listed and
removed, and each removal is the same audit event as one from the passkey pages.
"""

from __future__ import annotations

from typing import Any

from allauth.mfa.admin import AuthenticatorAdmin
from allauth.mfa.models import Authenticator
from allauth.mfa.signals import authenticator_removed
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

admin.site.unregister(Authenticator)


@admin.register(Authenticator)
class PasskeyAdmin(AuthenticatorAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @transaction.atomic
    def delete_model(self, request: HttpRequest, obj: Authenticator) -> None:
        obj.delete()
        authenticator_removed.send(
            sender=Authenticator, request=request, user=request.user, authenticator=obj
        )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Authenticator]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)
