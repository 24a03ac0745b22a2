"""Sign-in at the IdP with the username and password the directory file gives someone."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.backends import BaseBackend
from django.contrib.auth.models import User
from django.http import HttpRequest

from harness.idp.directory import directory_read


def person_of(username: str) -> dict[str, Any] | None:
    """Their entry in the directory as it stands now, or None if they are not (or no
    longer) in it."""
    person: dict[str, Any] | None = directory_read(settings.STATE_DIR)["people"].get(username)
    return person


class DirectoryBackend(BaseBackend):
    """Checks the password against the directory file and keeps a Django user per username.

    The user row (created at the first sign-in, never deleted) gives the person a ``sub``
    that stays the same for the IdP's life, as allauth's own ``sub`` is the user's pk.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        person = person_of(username) if username else None
        if person is None or password is None or password != person["password"]:
            return None
        user, _ = User.objects.get_or_create(username=username)
        user.email = person["email"]
        user.first_name = person["name"]
        user.set_unusable_password()
        user.save()
        return user

    def get_user(self, user_id: Any) -> User | None:
        # Someone removed from the directory is signed out of the IdP at their next
        # request: a session from before does not let them through.
        user = User.objects.filter(pk=user_id).first()
        if user is None or person_of(user.username) is None:
            return None
        return user
