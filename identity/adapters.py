"""django-allauth's adapters: where Settle's rules enter its sign-in flows.

Local accounts are never made by sign-up (``manage.py createsuperuser``, the admin);
the directory's people get theirs at their first single sign-on, identified by the
provider's subject, never by e-mail: an address another account holds is refused, not
merged. Every refusal is a page with a stable code, and an audit event.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from allauth.account import app_settings as account_settings
from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.authentication import get_authentication_records
from allauth.core import context
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.models import SocialLogin
from allauth.socialaccount.providers.base import AuthError
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from common.actors import Actor
from common.errors import ErrorCode
from identity.events import SSO_PENDING_SESSION_KEY, sign_in_refused
from identity.oidc import NonceProvider, SsoClaims, SsoRefused, claims_checked
from identity.roles import roles_sync
from identity.throttle import client_address


def refusal_page(request: HttpRequest, code: ErrorCode, **context: Any) -> HttpResponse:
    return render(
        request,
        "identity/refused.html",
        {"code": str(code), "message": code.message, **context},
        status=code.status,
    )


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False

    def is_reauthentication_required(self, *, app: str, **kwargs: Any) -> bool:
        """A sign-in less than ``ACCOUNT_REAUTHENTICATION_TIMEOUT`` ago counts as the
        confirmation that registering or removing a passkey asks for.

        allauth counts only a confirmation made after sign-in: someone who signed in a
        minute ago would be asked again, and someone who signed in by single sign-on,
        with no password and no passkey yet, has nothing allauth can ask for, and could
        never register their first passkey.
        """
        request = context.request
        records = get_authentication_records(request, request.user)
        if records and time.time() - records[-1]["at"] < account_settings.REAUTHENTICATION_TIMEOUT:
            return False
        return bool(super().is_reauthentication_required(app=app, **kwargs))

    def get_client_ip(self, request: HttpRequest) -> str:
        # allauth's own limits (sign-in attempts an address a minute) key on the same
        # client as django-axes does: behind the proxy, the address it forwards.
        return client_address(request)


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest, sociallogin: SocialLogin) -> bool:
        return True  # just in time: the first sign-in makes the account

    def get_provider(self, request: HttpRequest, provider: Any, client_id: Any = None) -> Any:
        found = super().get_provider(request, provider, client_id)
        if isinstance(found, OpenIDConnectProvider) and not isinstance(found, NonceProvider):
            return NonceProvider(request, app=found.app)
        return found

    def pre_social_login(self, request: HttpRequest, sociallogin: SocialLogin) -> None:
        try:
            claims = claims_checked(sociallogin)
        except SsoRefused as refused:
            dropped = refused.code is ErrorCode.SSO_GROUP_NOT_ALLOWED and sociallogin.is_existing
            if dropped:
                # Out of every allowed group: whatever the directory gave before goes.
                self._roles_drop(sociallogin, refused.claims)
            sign_in_refused(request, refused.code, refused.claims, **refused.detail)
            page = refusal_page(request, refused.code, roles_removed=dropped)
            raise ImmediateHttpResponse(page) from None
        if not sociallogin.is_existing and claims.email:
            taken = get_user_model().objects.filter(email__iexact=claims.email).exists()
            if taken:
                sign_in_refused(request, ErrorCode.SSO_EMAIL_TAKEN, claims)
                raise ImmediateHttpResponse(refusal_page(request, ErrorCode.SSO_EMAIL_TAKEN))
        if sociallogin.is_existing and not sociallogin.user.is_active:
            sign_in_refused(request, ErrorCode.SSO_ACCOUNT_INACTIVE, claims)
            raise ImmediateHttpResponse(refusal_page(request, ErrorCode.SSO_ACCOUNT_INACTIVE))
        request.settle_sso = claims  # type: ignore[attr-defined]
        # When allauth then asks for the person's passkey, the sign-in ends on a later
        # request: the session keeps the claims until then (identity.events).
        request.session[SSO_PENDING_SESSION_KEY] = dataclasses.asdict(claims)

    def _roles_drop(self, sociallogin: SocialLogin, claims: SsoClaims | None) -> None:
        if claims is None:
            return
        roles_sync(
            user=sociallogin.user,
            idp=claims.idp,
            subject=claims.subject,
            groups=[],
            actor=Actor.system(f"sso-{claims.idp}"),
        )

    def on_authentication_error(
        self,
        request: HttpRequest,
        provider: Any,
        error: Any = None,
        exception: Any = None,
        extra_context: Any = None,
    ) -> None:
        detail = {
            "idp": getattr(getattr(provider, "app", None), "provider_id", "") or "",
            "error": str(error or AuthError.UNKNOWN),
            "exception": type(exception).__name__ if exception else "",
        }
        sign_in_refused(request, ErrorCode.SSO_FAILED, None, **detail)
        if error != AuthError.CANCELLED:
            raise ImmediateHttpResponse(refusal_page(request, ErrorCode.SSO_FAILED))
