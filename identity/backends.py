"""Password sign-in, closed to all but superusers once single sign-on is on (break-glass).

The directory's people sign in through it; a local password then only serves when the
identity provider cannot, and only for a superuser. The refusal is the same as a wrong
password's, counted by django-axes alike, so that it tells a guesser nothing more.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.http import HttpRequest


class PasswordBackend(ModelBackend):
    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and settings.SETTLE_SSO_ENABLED and not user.is_superuser:
            if request is not None:
                request.settle_password_off = True  # type: ignore[attr-defined]
            return None
        return user
