from __future__ import annotations

from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The audit events of sign-in, sign-out, failures and passkeys added and
        # removed are signal receivers.
        from identity import events, passkeys  # noqa: F401
