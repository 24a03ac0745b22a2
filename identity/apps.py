from __future__ import annotations

from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The audit events of passkeys added and removed are signal receivers too.
        import identity.passkeys  # noqa: F401

        # The audit events of sign-in, sign-out and failures are signal receivers; so
        # are a session's stamps at sign-in and the end of a deactivated user's sessions.
        from identity import events, sessions  # noqa: F401
        from identity.rolemap import role_map

        # Read now, so that a mistake in the role map stops every process at start-up
        # (web, worker, beat) instead of the first sign-on.
        role_map()
