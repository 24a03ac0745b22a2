"""Directory groups to Settle roles: the file a team reviews (``SETTLE_OIDC_ROLE_MAP``).

A TOML file; each table names a group and, for each role it gives, the providers the role
applies on (``"*"``: every provider, those added later included)::

    [groups."settle-viewers"]
    viewer = ["*"]

    [groups."payments-oncall"]
    operator = ["payments"]
    decide_approvals = ["payments"]

    # Only for people who sign in through the identity provider "partner".
    [idp.partner.groups."partner-ops"]
    viewer = ["payments"]

The roles are ``recovery.services.roles.ROLES``. A person holds the union of what their
groups give; the file is read once, at start-up, and a mistake in it stops start-up.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from recovery.services.roles import ROLES

EVERY_PROVIDER = "*"


@dataclass(frozen=True)
class RoleMap:
    # idp id ("" for every identity provider) -> group -> role -> provider names
    groups: dict[str, dict[str, dict[str, tuple[str, ...]]]]

    def roles_of(self, idp: str, groups: list[str]) -> dict[str, set[str]]:
        """role -> the provider names (or ``"*"``) it applies on, for these groups."""
        found: dict[str, set[str]] = {}
        for scope in ("", idp):
            table = self.groups.get(scope, {})
            for group in groups:
                for role, providers in table.get(group, {}).items():
                    found.setdefault(role, set()).update(providers)
        return found


def _group_table(where: str, table: Any) -> dict[str, dict[str, tuple[str, ...]]]:
    if not isinstance(table, dict):
        raise ImproperlyConfigured(f"{where} is not a table of groups")
    groups = {}
    for group, roles in table.items():
        if not isinstance(roles, dict):
            raise ImproperlyConfigured(f'{where}."{group}" is not a table of roles')
        for role, providers in roles.items():
            if role not in ROLES:
                raise ImproperlyConfigured(
                    f'{where}."{group}": {role!r} is not a role ({", ".join(ROLES)})'
                )
            if not (
                isinstance(providers, list)
                and providers
                and all(isinstance(p, str) and p for p in providers)
            ):
                raise ImproperlyConfigured(
                    f'{where}."{group}".{role} is not a list of provider names (or "*")'
                )
        groups[group] = {role: tuple(providers) for role, providers in roles.items()}
    return groups


def role_map_parse(text: str, *, source: str = "the role map") -> RoleMap:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ImproperlyConfigured(f"{source}: {exc}") from None
    unknown = set(data) - {"groups", "idp"}
    if unknown:
        raise ImproperlyConfigured(f"{source}: unknown tables {sorted(unknown)} (groups, idp)")
    mapped = {"": _group_table(f"{source}: [groups]", data.get("groups", {}))}
    idps = data.get("idp", {})
    if not isinstance(idps, dict):
        raise ImproperlyConfigured(f"{source}: [idp] is not a table of identity providers")
    for idp, body in idps.items():
        if not isinstance(body, dict) or set(body) - {"groups"}:
            raise ImproperlyConfigured(f"{source}: [idp.{idp}] holds only a groups table")
        mapped[idp] = _group_table(f"{source}: [idp.{idp}.groups]", body.get("groups", {}))
    return RoleMap(mapped)


@cache
def _role_map_at(path: Path | None) -> RoleMap:
    if path is None:
        return RoleMap({})
    return role_map_parse(path.read_text(), source=str(path))


def role_map() -> RoleMap:
    """The configured map (empty without ``SETTLE_OIDC_ROLE_MAP``: nobody gets a role)."""
    return _role_map_at(settings.SETTLE_OIDC_ROLE_MAP)
