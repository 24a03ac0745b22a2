"""The IdP's pages: allauth's sign-in (``/accounts/login/``) and the OpenID Connect
endpoints (``/.well-known/openid-configuration``, ``/identity/o/…``)."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("accounts/", include("allauth.urls")),
    path("", include("allauth.idp.urls")),
]
