from __future__ import annotations

from django.apps import AppConfig


class CustomersConfig(AppConfig):
    """What a host's customer (a party) sees and does: the approval link's page, passkey
    enrolment and signing. No account, no sign-in: a link's token is the only key."""

    name = "customers"
    default_auto_field = "django.db.models.BigAutoField"
