from __future__ import annotations

from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The core records its changes without knowing who listens: the outbox does.
        from recovery.changes import changes_recorder_register
        from webhooks.outbox import outbox_changes_record

        changes_recorder_register(outbox_changes_record)
