"""Providers: an administrator configures a provider's adapter and secrets, audited."""

from __future__ import annotations

from recovery.adapters import ProviderConfig
from recovery.audit import (
    audit_append,
    audit_transaction,
)
from recovery.models import (
    Provider,
)
from recovery.services.errors import Invalid


@audit_transaction()
def provider_configure(
    *,
    name: str,
    adapter: str,
    path: str = "",
    url: str = "",
    secret: str = "",
    timeout_seconds: float | None = None,
    lease_seconds: int | None = None,
    actor: str = "admin",
) -> tuple[Provider, bool]:
    """Create or update a provider's adapter settings (an administrator's act, audited)."""
    if adapter not in Provider.Adapter.values:
        raise Invalid("invalid_adapter", f"adapter must be one of {Provider.Adapter.values}")
    if adapter in {Provider.Adapter.SQLITE, Provider.Adapter.JOURNAL} and not path:
        raise Invalid("missing_path", f"the {adapter} adapter needs --path")
    if adapter == Provider.Adapter.HTTP and not (url and secret):
        raise Invalid("missing_url", "the http adapter needs --url and --secret")
    if timeout_seconds is not None and not 0 < timeout_seconds <= 60:
        raise Invalid("invalid_timeout", "timeout must be more than 0 and at most 60 seconds")
    if lease_seconds is not None and lease_seconds < 1:
        raise Invalid("invalid_lease", "lease must be at least 1 second")
    provider = Provider.objects.select_for_update().filter(name=name).first()
    created = provider is None
    if provider is None:
        provider = Provider(name=name)
    provider.adapter, provider.path, provider.url = adapter, path, url
    if secret:
        provider.secret = secret
    if timeout_seconds is not None:
        provider.timeout_seconds = timeout_seconds
    if lease_seconds is not None:
        provider.lease_seconds = lease_seconds
    provider.save()
    audit_append(
        kind="provider_configured",
        actor=actor,
        data={
            "provider": name,
            "adapter": adapter,
            "path": path,
            "url": url,
            "timeout_seconds": provider.timeout_seconds,
            "lease_seconds": provider.lease_seconds,
            "secret_changed": bool(secret),
        },
    )
    return provider, created


def provider_config(provider: Provider) -> ProviderConfig:
    return ProviderConfig(
        adapter=provider.adapter,
        path=provider.path,
        url=provider.url,
        secret=provider.secret,
        timeout_seconds=provider.timeout_seconds,
    )
