"""The IdP's adapters: claims from the directory file, and the faults a test asked for."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Literal

from allauth.account.adapter import DefaultAccountAdapter
from allauth.idp.oidc import app_settings
from allauth.idp.oidc.adapter import DefaultOIDCAdapter
from allauth.idp.oidc.models import Client
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import User
from django.http import HttpRequest

from harness.idp.directory import directory_read

# What a token with the nonce fault carries instead of the request's nonce.
WRONG_NONCE = "not-the-nonce-of-the-request"
# How far in the past an expired token's exp lies: beyond any clock leeway a client allows.
EXPIRED_BY_SECONDS = 3600


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        # People come from the directory file only.
        return False


class OIDCAdapter(DefaultOIDCAdapter):
    def get_issuer(self) -> str:
        # The configured http://localhost:<port>, not built from the request's Host; the
        # issuer fault changes it for discovery and for the tokens' "iss" alike.
        faults = directory_read(settings.STATE_DIR)["faults"]
        return str(faults.get("issuer") or settings.IDP_ISSUER)

    def get_user_sub(self, client: Client, user: AbstractBaseUser) -> str:
        person = directory_read(settings.STATE_DIR)["people"].get(user.get_username())
        if person is not None and person.get("sub"):
            return str(person["sub"])
        return super().get_user_sub(client, user)

    def get_user_by_sub(self, client: Client, sub: str) -> AbstractBaseUser | None:
        for username, person in directory_read(settings.STATE_DIR)["people"].items():
            if person.get("sub") == sub:
                return User.objects.filter(username=username, is_active=True).first()
        return super().get_user_by_sub(client, sub)

    def get_claims(
        self,
        purpose: Literal["id_token", "userinfo"],
        user: AbstractBaseUser,
        client: Client,
        scopes: Iterable[str],
        email: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The same claims in the ID token and at userinfo: sub, email and name by scope,
        and the groups (under the directory's claim name) always."""
        scopes = list(scopes)
        directory = directory_read(settings.STATE_DIR)
        person = directory["people"].get(user.get_username())
        claims: dict[str, Any] = {"sub": self.get_user_sub(client, user)}
        if person is None:
            return claims
        if "email" in scopes:
            claims["email"] = person["email"]
            claims["email_verified"] = bool(person["email_verified"])
        if "profile" in scopes:
            claims["name"] = person["name"]
            claims["preferred_username"] = user.get_username()
        claims[directory["groups_claim"]] = list(person["groups"])
        return claims

    def populate_id_token(
        self, id_token: dict[str, Any], client: Client, scopes: Iterable[str], **kwargs: Any
    ) -> None:
        # oauthlib has put the request's nonce in already; allauth has set iss and exp.
        faults = directory_read(settings.STATE_DIR)["faults"]
        if faults.get("nonce"):
            id_token["nonce"] = WRONG_NONCE
        if faults.get("expired"):
            id_token["exp"] = int(time.time()) - EXPIRED_BY_SECONDS
            id_token["iat"] = id_token["exp"] - app_settings.ID_TOKEN_EXPIRES_IN
