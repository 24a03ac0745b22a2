"""The sign-in page: django-allauth's, offering each configured identity provider."""

from __future__ import annotations

from typing import Any

from allauth.account.views import LoginView
from django.conf import settings


class SignInView(LoginView):
    # FormView treats PUT as POST; a sign-in is a POST.
    http_method_names = ["get", "head", "post", "options"]

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        context["sso_providers"] = settings.SETTLE_OIDC
        return context
