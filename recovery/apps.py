from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _roles_ensure(sender: AppConfig, **kwargs: Any) -> None:
    """The role groups follow ``recovery.services.roles`` after every migrate.

    After migrate rather than in a data migration: the permissions they hold are
    created after migrate too (by django.contrib.auth, whose handler runs first).
    """
    from recovery.services.roles import roles_ensure

    roles_ensure()


class RecoveryConfig(AppConfig):
    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_roles_ensure, sender=self)
