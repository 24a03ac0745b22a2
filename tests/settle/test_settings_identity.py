"""The identity provider's settings: with SETTLE_HTTPS on, an issuer is reached over HTTPS."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from settle.settings_identity import _oidc_providers


@pytest.fixture
def issuer(monkeypatch):
    def configure(url: str, prefix: str = "SETTLE_OIDC") -> None:
        monkeypatch.setenv(f"{prefix}_ISSUER", url)
        monkeypatch.setenv(f"{prefix}_CLIENT_ID", "settle")
        monkeypatch.setenv(f"{prefix}_CLIENT_SECRET", "s")

    for name in ("SETTLE_OIDC_ISSUER", "SETTLE_OIDC_PROVIDERS"):
        monkeypatch.delenv(name, raising=False)
    return configure


@pytest.mark.parametrize(
    "url", ["http://id.example.com", "http://10.0.0.5:8080/realms/x", "http://localhost.evil.com"]
)
def test_plain_http_issuer_refuses_start_up_behind_https(issuer, url):
    issuer(url)
    with pytest.raises(ImproperlyConfigured, match=r"SETTLE_OIDC_ISSUER=.*must be an https://"):
        _oidc_providers(https=True)


def test_plain_http_issuer_of_a_named_provider_is_refused_by_its_own_variable(issuer, monkeypatch):
    issuer("https://id.example.com")
    monkeypatch.setenv("SETTLE_OIDC_PROVIDERS", "partner")
    issuer("http://partner.example.com", prefix="SETTLE_OIDC_PARTNER")
    with pytest.raises(ImproperlyConfigured, match="SETTLE_OIDC_PARTNER_ISSUER="):
        _oidc_providers(https=True)


@pytest.mark.parametrize(
    "url",
    [
        "https://id.example.com",
        "http://127.0.0.1:8001",
        "http://127.5.6.7",
        "http://[::1]:9000/idp",
        "http://localhost:8001",
    ],
)
def test_https_or_loopback_issuer_is_accepted_behind_https(issuer, url):
    issuer(url)
    (provider,) = _oidc_providers(https=True)
    assert provider.issuer == url


def test_plain_http_issuer_is_accepted_without_https(issuer):
    issuer("http://id.example.com")
    (provider,) = _oidc_providers(https=False)
    assert provider.issuer == "http://id.example.com"
