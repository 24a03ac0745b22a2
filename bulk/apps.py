from __future__ import annotations

from django.apps import AppConfig


class BulkConfig(AppConfig):
    """Bulk work: one action on a frozen selection of operations, run by Celery in chunks.

    Its tables were the console's (``console_bulkbatch``, ``console_bulkitem``) and keep
    those names: the move changed where the code lives, not the data.
    """

    name = "bulk"
    default_auto_field = "django.db.models.BigAutoField"
