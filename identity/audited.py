"""How identity's audit events name the console user each is about: the same two fields
in every one, so that the trail's events of one person read alike."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser


def user_named(user: AbstractBaseUser) -> dict[str, Any]:
    return {"user": user.get_username(), "user_id": user.pk}
