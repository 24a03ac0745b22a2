"""Single sign-on in the tests: Settle configured for the tests' own identity provider
(``harness.oidc``), and a sign-in through it driven by Django's test client."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.http import HttpResponse
from django.test import Client

from harness.oidc import IdentityProvider
from settle.settings_identity import OidcProvider, socialaccount_providers

CLIENT_ID = "settle-console"
CLIENT_SECRET = "a-client-secret-for-tests-only"
LOGIN = "/accounts/oidc/sso/login/"
CALLBACK = "/accounts/oidc/sso/login/callback/"
# The test client's host: where the IdP sends the browser back to.
TEST_SERVER = "http://testserver"

ROLE_MAP = """
[groups."settle-viewers"]
viewer = ["*"]

[groups."settle-operators"]
operator = ["*"]

[groups."orders-leads"]
supervisor = ["orders"]
"""


def sso_on(
    settings: Any,
    idp: IdentityProvider,
    folder: Path,
    *,
    allowed_groups: tuple[str, ...] = (),
    groups_claim: str = "groups",
    role_map: str = ROLE_MAP,
    base: str = TEST_SERVER,
) -> OidcProvider:
    """Settle's settings as SETTLE_OIDC_* would make them, for ``idp``; its client there."""
    provider = OidcProvider(
        id="sso",
        issuer=idp.issuer,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        label="Sign in with the directory",
        groups_claim=groups_claim,
        allowed_groups=allowed_groups,
    )
    settings.SETTLE_OIDC = (provider,)
    settings.SETTLE_SSO_ENABLED = True
    settings.SOCIALACCOUNT_PROVIDERS = socialaccount_providers((provider,))
    path = folder / "roles.toml"
    path.write_text(role_map)
    settings.SETTLE_OIDC_ROLE_MAP = path
    idp.client(client_id=CLIENT_ID, secret=CLIENT_SECRET, redirect_uris=[base + CALLBACK])
    return provider


def sso_start(client: Client) -> str:
    """Press the sign-in button: the authorization request Settle sends the browser to."""
    start = client.post(LOGIN)
    assert start.status_code == 302, start.content[:500]
    return str(start["Location"])


def sso_sign_in(client: Client, idp: IdentityProvider, username: str) -> HttpResponse:
    """A whole single sign-on: Settle's button, the IdP's sign-in, Settle's callback."""
    back = urlsplit(idp.authorize(sso_start(client), username))
    response: HttpResponse = client.get(f"{back.path}?{back.query}")
    return response
