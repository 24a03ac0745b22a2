from __future__ import annotations

from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The audit events of sign-in, sign-out and failures are signal receivers; so
        # are a session's stamps at sign-in and the end of a deactivated user's sessions.
        from identity import events, sessions  # noqa: F401
