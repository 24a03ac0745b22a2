"""The sign-in page (django-allauth's, offering each configured identity provider and
passkeys), and the page that holds a supervisor until they have used a passkey."""

from __future__ import annotations

from typing import Any

from allauth.account.views import LoginView
from allauth.mfa.models import Authenticator
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from identity.sessions import session_expiry_set


class SignInView(LoginView):
    # FormView treats PUT as POST; a sign-in is a POST.
    http_method_names = ["get", "head", "post", "options"]

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        context["sso_providers"] = settings.SETTLE_OIDC
        return context

    def form_valid(self, form: Any) -> HttpResponse:
        response: HttpResponse = super().form_valid(form)
        if self.request.user.is_authenticated:
            # allauth's form sets the session's expiry after the sign-in (its "remember
            # me": 0, until the browser closes, counted from each write): fix it again.
            session_expiry_set(self.request)
        return response


@login_required
def passkey_required(request: HttpRequest) -> HttpResponse:
    """Where ``PasskeyRequiredMiddleware`` holds a supervisor: register a passkey, or
    prove the one registered (allauth's reauthentication with it records the use)."""
    has_passkey = Authenticator.objects.filter(
        user_id=request.user.pk, type=Authenticator.Type.WEBAUTHN
    ).exists()
    return render(
        request,
        "identity/passkey_required.html",
        {"has_passkey": has_passkey},
    )
