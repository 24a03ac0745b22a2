"""The project package as an app: what it wires into Django when the apps are ready."""

from __future__ import annotations

import logging

from django.apps import AppConfig

logger = logging.getLogger(__name__)


class SettleConfig(AppConfig):
    name = "settle"
    verbose_name = "Settle"

    def ready(self) -> None:
        from settle.locals import install

        left = install()
        if left:
            logger.warning(
                "Django's per-thread state is read asgiref's own way (built otherwise than "
                "settle.locals knows): %s",
                ", ".join(left),
            )
