"""Console roles: what a viewer, an operator and a supervisor may do, per provider.

Two more roles hold one of a supervisor's duties each: ``decide_approvals`` and
``approve_reconciliations``.

role
    A named set of the object permissions on ``Provider`` (``recovery.permissions``).
    Each role is also a ``Group`` holding exactly those permissions, so that the admin
    shows what a role means; membership of the group grants nothing by itself.
grant
    A role given to one user on one provider: each of the role's permissions assigned
    to the user on that provider (django-guardian), audited. The console only ever asks
    for object permissions, so a role always names the providers it applies to.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from guardian.shortcuts import assign_perm

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Provider
from recovery.permissions import ProviderPermission as P
from recovery.services.errors import NotFound

VIEWER = (P.VIEW_OPERATIONS,)
OPERATOR = (
    *VIEWER,
    P.LOOKUP_OPERATIONS,
    P.CONFIRM_OPERATIONS,
    P.REPAIR_OPERATIONS,
    P.VOID_OPERATIONS,
    P.PROPOSE_RECONCILIATIONS,
)
SUPERVISOR = (*OPERATOR, P.APPROVE_RECONCILIATIONS, P.DECIDE_APPROVALS)
ROLES: dict[str, tuple[P, ...]] = {
    "viewer": VIEWER,
    "operator": OPERATOR,
    "supervisor": SUPERVISOR,
    # One duty of a supervisor's each, for a directory group that holds just that duty.
    "decide_approvals": (*VIEWER, P.DECIDE_APPROVALS),
    "approve_reconciliations": (*VIEWER, P.APPROVE_RECONCILIATIONS),
}


def _permissions(codenames: tuple[P, ...]) -> list[Permission]:
    found = list(
        Permission.objects.filter(content_type__app_label="recovery", codename__in=codenames)
    )
    missing = sorted(set(codenames) - {p.codename for p in found})
    if missing:  # permissions are created after migrate; a half-migrated database
        raise NotFound(ErrorCode.UNKNOWN_PERMISSION, f"run migrate first: no {', '.join(missing)}")
    return found


def roles_ensure() -> dict[str, Group]:
    """Create or correct the role groups; running it again changes nothing."""
    groups = {}
    for name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(_permissions(codenames))
        groups[name] = group
    return groups


@audit_transaction()
def role_grant(*, user: AbstractBaseUser, role: str, provider: Provider, actor: Actor) -> list[str]:
    """Give ``user`` the permissions of ``role`` on ``provider``; audited.

    Adds to what the user already holds and never takes anything away: granting
    ``viewer`` to an operator leaves them an operator. Returns the permissions granted.
    """
    if role not in ROLES:
        raise NotFound(ErrorCode.UNKNOWN_ROLE, f"a role is one of {', '.join(ROLES)}")
    granted = []
    for permission in _permissions(ROLES[role]):
        assign_perm(permission, user, provider)
        granted.append(permission.codename)
    audit_append(
        kind=AuditKind.PERMISSION_GRANTED,
        actor=actor,
        data={
            "user": user.get_username(),
            "role": role,
            "provider": provider.name,
            "provider_id": provider.pk,
            "permissions": sorted(granted),
        },
    )
    return sorted(granted)
