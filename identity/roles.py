"""Roles from the directory: at every single sign-on, a person's object permissions on the
providers become exactly what their groups give (``identity.rolemap``), added and removed.

The directory is the source of a signed-in person's roles: a role granted by hand
(``manage.py grant``) to a directory user lasts until their next sign-in.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.contrib.contenttypes.models import ContentType
from guardian.models import UserObjectPermission

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from identity.audited import user_named
from identity.rolemap import EVERY_PROVIDER, role_map
from recovery.models import Provider
from recovery.services.roles import ROLES

Grant = tuple[str, int]  # (permission codename, provider id)


def grants_of(roles: dict[str, set[str]], providers: dict[str, int]) -> set[Grant]:
    """The (permission, provider) pairs that ``roles`` (role -> provider names) give."""
    grants: set[Grant] = set()
    for role, names in roles.items():
        ids = (
            providers.values()
            if EVERY_PROVIDER in names
            else [providers[name] for name in names if name in providers]
        )
        grants.update((str(codename), pk) for codename in ROLES[role] for pk in ids)
    return grants


@audit_transaction()
def roles_sync(
    *, user: AbstractBaseUser, idp: str, subject: str, groups: list[str], actor: Actor
) -> tuple[set[Grant], set[Grant]]:
    """Make ``user``'s provider permissions what ``groups`` give; returns (added, removed).

    One audit event when anything changed, naming the groups and each permission added
    or removed, so that the record says why a person could act on a day.
    """
    roles = role_map().roles_of(idp, groups)
    providers = dict(Provider.objects.values_list("name", "pk"))
    wanted = grants_of(roles, providers)
    content_type = ContentType.objects.get_for_model(Provider)
    held = {
        (codename, int(object_pk)): pk
        for pk, codename, object_pk in UserObjectPermission.objects.filter(
            user=user, content_type=content_type
        ).values_list("pk", "permission__codename", "object_pk")
    }
    added, removed = wanted - held.keys(), held.keys() - wanted
    if removed:
        UserObjectPermission.objects.filter(pk__in=[held[g] for g in removed]).delete()
    if added:
        permissions = dict(
            Permission.objects.filter(
                content_type=content_type, codename__in={c for c, _ in added}
            ).values_list("codename", "pk")
        )
        UserObjectPermission.objects.bulk_create(
            UserObjectPermission(
                user=user,  # type: ignore[misc]
                content_type=content_type,
                permission_id=permissions[codename],
                object_pk=str(provider_pk),
            )
            for codename, provider_pk in sorted(added)
        )
    joined, left = _groups_mirror(user, groups)
    if added or removed or joined or left:
        names = {pk: name for name, pk in providers.items()}
        audit_append(
            kind=AuditKind.ROLES_SYNCED,
            actor=actor,
            data={
                **user_named(user),
                "idp": idp,
                "subject": subject,
                "groups": sorted(groups),
                "roles": {role: sorted(names) for role, names in sorted(roles.items())},
                "added": _listed(added, names),
                "removed": _listed(removed, names),
                "groups_joined": sorted(joined),
                "groups_left": sorted(left),
            },
        )
    return added, removed


def _groups_mirror(user: AbstractBaseUser, groups: list[str]) -> tuple[set[str], set[str]]:
    """Make ``user``'s Django groups their directory groups; returns (joined, left).

    An approval policy names the groups its people come from, and a person's groups are
    read from Django's groups whoever signs them in. The roles' own groups are left
    alone (their membership grants nothing), as are names too long for a group.
    """
    roles = set(ROLES)
    wanted = {name for name in groups if name not in roles and 0 < len(name) <= 150}
    held = set(user.groups.values_list("name", flat=True)) - roles  # type: ignore[attr-defined]
    joined, left = wanted - held, held - wanted
    if joined:
        found = {group.name: group for group in Group.objects.filter(name__in=joined)}
        made = [Group(name=name) for name in sorted(joined - found.keys())]
        Group.objects.bulk_create(made, ignore_conflicts=True)
        user.groups.add(*Group.objects.filter(name__in=joined))  # type: ignore[attr-defined]
    if left:
        user.groups.remove(*Group.objects.filter(name__in=left))  # type: ignore[attr-defined]
    return joined, left


def _listed(grants: set[Grant], names: dict[int, str]) -> dict[str, list[str]]:
    """provider name -> permissions, for the audit record (a removed provider by its id)."""
    listed: dict[str, list[str]] = {}
    for codename, pk in sorted(grants):
        listed.setdefault(names.get(pk, f"#{pk}"), []).append(codename)
    return listed
