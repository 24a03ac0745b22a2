from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.actors import COMMAND_LINE
from recovery.models import Provider
from recovery.services.errors import RecoveryError
from recovery.services.roles import ROLES, role_grant, roles_ensure


class Command(BaseCommand):
    help = (
        "Give a console user a role (viewer, operator, supervisor, ...) on one provider: the "
        "role's object permissions on that provider. Adds, never removes; audited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the console user's username")
        parser.add_argument("role", choices=sorted(ROLES))
        parser.add_argument("provider", help="the provider's name")

    def handle(self, *args: Any, user: str, role: str, provider: str, **options: Any) -> None:
        account = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: user}).first()
        if account is None:
            raise CommandError(f"no user named {user!r}")
        target = Provider.objects.filter(name=provider).first()
        if target is None:
            raise CommandError(f"no provider named {provider!r}")
        try:
            roles_ensure()
            granted = role_grant(user=account, role=role, provider=target, actor=COMMAND_LINE)
        except RecoveryError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{user} is {role} on {provider}: {', '.join(granted)}")
