from __future__ import annotations

from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # An approval that expires is owed an "expired" notice, written with the expiry.
        from monitoring.services.approval_notices import approval_expired_notices_record
        from recovery.changes import changes_recorder_register

        changes_recorder_register(approval_expired_notices_record)
