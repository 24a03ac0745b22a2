"""The host API's own way through Django for a request signed with a token.

A request to ``/api/`` that carries an ``Authorization`` header is authenticated by that
token alone (``recovery.api.carries_token``): the session's cookie is never read for it,
so the session, CSRF, authentication, sign-in, messages, htmx, allauth, passkey-hold and
django-axes middleware have nothing to do for it but cost. This middleware sits above
them and, for such a request, calls the view itself; every other request (a console
session on the approval endpoints, the passkey hold included, every page) goes down the
whole stack.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

from recovery.api import carries_token

# What the shortcut leaves out, for the test that holds it (tests/recovery/test_token_path.py).
SKIPPED = (
    "whitenoise.middleware.WhiteNoiseMiddleware",  # serves /static/ only
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "identity.sessions.IdleSignOutMiddleware",
    "allauth.usersessions.middleware.UserSessionsMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "identity.passkeys.PasskeyRequiredMiddleware",
    "axes.middleware.AxesMiddleware",
)


class TokenRequestMiddleware:
    """Send a token-signed API request straight to its view, past the session's middleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not (request.path_info.startswith("/api/") and carries_token(request)):
            return self.get_response(request)
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return self.get_response(request)  # Django's own 404, as for any other request
        # CommonMiddleware's check of the Host header (ALLOWED_HOSTS): 400 if not allowed.
        request.get_host()
        request.resolver_match = match
        # Nobody is signed in for this request: the token is its only credential.
        request.user = AnonymousUser()
        response: HttpResponse = match.func(request, *match.args, **match.kwargs)
        # What CommonMiddleware would add: without it gunicorn sends the body chunked.
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        return response
