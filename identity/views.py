"""The sign-in page: django-allauth's, offering each configured identity provider."""

from __future__ import annotations

from typing import Any

from allauth.account.views import LoginView
from django.conf import settings
from django.http import HttpResponse

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
