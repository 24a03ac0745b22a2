"""Single sign-on through OpenID Connect: what Settle checks beyond django-allauth.

allauth does discovery, the state (one use, in the session), PKCE, and the ID token's
signature, audience, issuer (as discovery names it) and expiry. Settle adds:

nonce
    A fresh random value in every authorization request, kept in the sign-in's state;
    the ID token must carry it, so that a token minted for another sign-in is refused.
issuer
    The ID token's ``iss`` must be the issuer configured (``SETTLE_OIDC_ISSUER``), not
    merely the one the discovery document names.
groups
    From the groups claim (userinfo, else the ID token); with allowed groups configured,
    a person in none of them is refused.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from allauth.socialaccount.models import SocialLogin
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from common.errors import ErrorCode

# The sign-in's state (allauth's, in the session) keeps the nonce under this key.
NONCE = "settle_nonce"


class NonceProvider(OpenIDConnectProvider):
    """allauth's OpenID Connect provider, sending a nonce with each authorization request."""

    def redirect(
        self,
        request: HttpRequest,
        process: Any,
        next_url: str | None = None,
        data: Any = None,
        **kwargs: Any,
    ) -> HttpResponse:
        nonce = secrets.token_urlsafe(32)
        auth_params = kwargs.pop("auth_params", None)
        if auth_params is None:
            auth_params = self.get_auth_params()
        auth_params["nonce"] = nonce
        kwargs[NONCE] = nonce  # stashed with the state, returned with it to the callback
        response: HttpResponse = super().redirect(
            request, process, next_url, data, auth_params=auth_params, **kwargs
        )
        return response


@dataclass(frozen=True)
class SsoClaims:
    """Who the identity provider says signed in: what Settle keeps of it."""

    idp: str
    subject: str
    issuer: str
    email: str
    groups: list[str]


class SsoRefused(Exception):
    def __init__(self, code: ErrorCode, claims: SsoClaims | None, **detail: Any) -> None:
        self.code = code
        self.claims = claims
        self.detail = detail
        super().__init__(code.message)


def provider_config(idp: str) -> Any:
    """The configured identity provider named ``idp`` (``settings.SETTLE_OIDC``)."""
    return next(p for p in settings.SETTLE_OIDC if p.id == idp)


def _groups(value: Any) -> list[str]:
    if isinstance(value, str):  # some providers send one group as a string
        return [value]
    if isinstance(value, list):
        return sorted({str(v) for v in value if isinstance(v, str | int)})
    return []


def claims_checked(sociallogin: SocialLogin) -> SsoClaims:
    """The sign-in's claims, once the nonce, the issuer and the groups allow it.

    Raises ``SsoRefused`` naming the first check that failed.
    """
    account = sociallogin.account
    config = provider_config(account.provider)
    extra = account.extra_data or {}
    id_token = extra.get("id_token") or {}
    userinfo = extra.get("userinfo") or {}
    claim = config.groups_claim
    groups = _groups(userinfo[claim] if claim in userinfo else id_token.get(claim))
    claims = SsoClaims(
        idp=config.id,
        subject=str(account.uid),
        issuer=str(id_token.get("iss", "")),
        email=str(userinfo.get("email") or id_token.get("email") or ""),
        groups=groups,
    )
    expected = (sociallogin.state or {}).get(NONCE)
    got = id_token.get("nonce")
    if not (
        isinstance(expected, str)
        and isinstance(got, str)
        and hmac.compare_digest(expected.encode(), got.encode())
    ):
        raise SsoRefused(ErrorCode.SSO_NONCE_MISMATCH, claims)
    if claims.issuer.rstrip("/") != config.issuer:
        raise SsoRefused(ErrorCode.SSO_ISSUER_UNKNOWN, claims, expected=config.issuer)
    if config.allowed_groups and not set(groups) & set(config.allowed_groups):
        raise SsoRefused(ErrorCode.SSO_GROUP_NOT_ALLOWED, claims, allowed=config.allowed_groups)
    return claims
