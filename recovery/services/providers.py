"""Providers: an administrator configures a provider's adapter and secrets, audited.

Every change — from the admin or from ``manage.py add_provider`` — goes through
``provider_save``, keyed by the provider's id, so that a rename is a rename (the same
provider, its approvals and permits following the new name) and never a second provider.
The secret is write-only: set or replaced, never shown back, never in the audit log.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.db import IntegrityError

from approvals.services.approvals import provider_rename
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import COMMAND_LINE, Actor
from common.errors import ErrorCode
from recovery.adapters import ProviderConfig, mcp_server_parse
from recovery.models import Provider
from recovery.services.errors import Invalid

# Provider names appear in URLs (callbacks) and in approvals' bindings.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_AUDITED = (
    "name",
    "adapter",
    "path",
    "url",
    "timeout_seconds",
    "lease_seconds",
    "lookup_budget",
    "absent_is_authoritative",
)
SECRET_MAX_LENGTH = Provider._meta.get_field("secret").max_length or 0
_OPTIONAL = ("timeout_seconds", "lease_seconds", "lookup_budget", "absent_is_authoritative")


@dataclass(frozen=True)
class ProviderSettings:
    """What an administrator sets; ``None`` keeps the current value (or the default)."""

    name: str
    adapter: str
    path: str = ""
    url: str = ""
    secret: str | None = None  # None or "": keep the stored secret
    timeout_seconds: float | None = None
    lease_seconds: int | None = None
    lookup_budget: int | None = None
    absent_is_authoritative: bool | None = None


def provider_settings_check(settings: ProviderSettings, *, has_secret: bool = False) -> None:
    """Raise ``Invalid`` with a stable code for settings no provider may have.

    ``has_secret``: the provider already stores a secret (one need not be given again).
    """
    if not NAME_PATTERN.fullmatch(settings.name):
        raise Invalid(ErrorCode.INVALID_NAME, "a provider name is letters, digits, '.', '_' or '-'")
    if settings.adapter not in Provider.Adapter.values:
        raise Invalid(
            ErrorCode.INVALID_ADAPTER, f"adapter must be one of {Provider.Adapter.values}"
        )
    if settings.adapter in {Provider.Adapter.SQLITE, Provider.Adapter.JOURNAL}:
        if not settings.path:
            raise Invalid(ErrorCode.MISSING_PATH, f"the {settings.adapter} adapter needs --path")
        if not os.path.isabs(settings.path) or "\x00" in settings.path:
            raise Invalid(ErrorCode.INVALID_PATH, "the path must be absolute")
    if settings.adapter == Provider.Adapter.HTTP:
        if not (settings.url and (settings.secret or has_secret)):
            raise Invalid(ErrorCode.MISSING_URL, "the http adapter needs --url and --secret")
        parts = urllib.parse.urlsplit(settings.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise Invalid(ErrorCode.INVALID_URL, "the URL must be http:// or https:// with a host")
    if settings.secret and len(settings.secret) > SECRET_MAX_LENGTH:
        raise Invalid(
            ErrorCode.SECRET_TOO_LONG, f"the secret is longer than {SECRET_MAX_LENGTH} characters"
        )
    # Without a secret an mcp provider has no evidence tool: each lookup is unavailable.
    if settings.adapter == Provider.Adapter.MCP and settings.secret:
        try:
            mcp_server_parse(settings.secret)
        except ValueError as exc:
            raise Invalid(ErrorCode.INVALID_MCP_SECRET, str(exc)) from None
    if settings.timeout_seconds is not None and not 0 < settings.timeout_seconds <= 60:
        raise Invalid(
            ErrorCode.INVALID_TIMEOUT, "timeout must be more than 0 and at most 60 seconds"
        )
    if settings.lease_seconds is not None and settings.lease_seconds < 1:
        raise Invalid(ErrorCode.INVALID_LEASE, "lease must be at least 1 second")
    if settings.lookup_budget is not None and settings.lookup_budget < 1:
        raise Invalid(ErrorCode.INVALID_LOOKUP_BUDGET, "the lookup budget must be at least 1")


@audit_transaction()
def provider_save(
    *, provider_id: int | None, settings: ProviderSettings, actor: Actor
) -> tuple[Provider, bool]:
    """Create a provider (``provider_id`` None) or change the one with that id; audited."""
    provider = (
        Provider()
        if provider_id is None
        else Provider.objects.select_for_update().filter(pk=provider_id).first()
    )
    if provider is None:
        raise Invalid(ErrorCode.UNKNOWN_PROVIDER, f"no provider with id {provider_id}")
    provider_settings_check(settings, has_secret=bool(provider.secret))
    before = {field: getattr(provider, field) for field in _AUDITED}
    provider.name, provider.adapter = settings.name, settings.adapter
    provider.path, provider.url = settings.path, settings.url
    for field in _OPTIONAL:
        if getattr(settings, field) is not None:
            setattr(provider, field, getattr(settings, field))
    if settings.secret:
        provider.secret = settings.secret
    try:
        provider.save()
    except IntegrityError:
        raise Invalid(
            ErrorCode.NAME_TAKEN, f"another provider is named {settings.name!r}"
        ) from None
    created = provider_id is None
    renamed = not created and before["name"] != provider.name
    if renamed:
        provider_rename(old=str(before["name"]), new=provider.name)
    changes: dict[str, Any] = {
        field: [before[field], getattr(provider, field)]
        for field in _AUDITED
        if created or before[field] != getattr(provider, field)
    }
    audit_append(
        kind=AuditKind.PROVIDER_CONFIGURED,
        actor=actor,
        data={
            "provider_id": provider.pk,
            "provider": provider.name,
            "created": created,
            "changes": changes,
            "secret_changed": bool(settings.secret),
        },
    )
    return provider, created


def provider_configure(
    *,
    name: str,
    adapter: str,
    path: str = "",
    url: str = "",
    secret: str = "",
    timeout_seconds: float | None = None,
    lease_seconds: int | None = None,
    lookup_budget: int | None = None,
    absent_is_authoritative: bool | None = None,
    actor: Actor = COMMAND_LINE,
) -> tuple[Provider, bool]:
    """Create or update the provider named ``name`` (``manage.py add_provider``)."""
    existing = Provider.objects.filter(name=name).values_list("pk", flat=True).first()
    return provider_save(
        provider_id=existing,
        settings=ProviderSettings(
            name=name,
            adapter=adapter,
            path=path,
            url=url,
            secret=secret or None,
            timeout_seconds=timeout_seconds,
            lease_seconds=lease_seconds,
            lookup_budget=lookup_budget,
            absent_is_authoritative=absent_is_authoritative,
        ),
        actor=actor,
    )


def provider_config(provider: Provider) -> ProviderConfig:
    return ProviderConfig(
        adapter=provider.adapter,
        path=provider.path,
        url=provider.url,
        secret=provider.secret,
        timeout_seconds=provider.timeout_seconds,
        allow_private=django_settings.SETTLE_MCP_ALLOW_PRIVATE,
    )
