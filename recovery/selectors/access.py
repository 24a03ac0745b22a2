"""Who may see what: the selectors that take the caller and return only what it may see.

A host sees its own operations; an approver its scope (its providers, and its hosts if
any); a console user the providers on which it holds an object permission
(``recovery.permissions``), and the system chain of the audit trail if it supervises.
The other selector modules start from these, or take an object already read through them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db.models import Exists, Q, QuerySet
from guardian.core import ObjectPermissionChecker
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import get_objects_for_user, get_perms

from approvals.models import Approval, Approver
from audit.models import AuditAlarm
from common.errors import ErrorCode
from recovery.models import Host, Operation, Provider
from recovery.permissions import ACTING_PERMISSIONS, ProviderPermission
from recovery.services.errors import NotFound


def operations_for_host(*, host: Host) -> QuerySet[Operation]:
    return Operation.objects.filter(host=host).select_related("provider", "host")


def operations_for_approver(*, approver: Approver) -> QuerySet[Operation]:
    """The operations ``approver`` may decide for: its providers, and its hosts if any."""
    return Operation.objects.filter(approver.scope(provider="provider__name", host="host__name"))


def providers_for_user(
    *, user: Any, permissions: tuple[ProviderPermission, ...]
) -> QuerySet[Provider]:
    """The providers on which ``user`` holds any of ``permissions``.

    Object permissions only: a role applies to the providers it was granted on
    (``manage.py grant``, ``recovery.services.roles``); a model-wide permission grants
    nothing here. Superusers see all.
    """
    return get_objects_for_user(
        user,
        [permission.perm for permission in permissions],
        klass=Provider,
        any_perm=True,
        accept_global_perms=False,
    )


def provider_permissions(*, user: Any, provider: Provider) -> frozenset[str]:
    """The permissions ``user`` holds on ``provider`` (codenames), read at once.

    The same object permissions ``providers_for_user`` asks about, for a page that needs
    several answers about one provider.
    """
    if not user.is_active:
        return frozenset()
    if user.is_superuser:
        return frozenset(get_perms(user, provider))
    # Guardian's own two reads (the user's permissions, their groups'), sent as one
    # statement: every operation page asks.
    checker = ObjectPermissionChecker(user)
    # Unordered: a compound statement's parts may not sort (Permission's Meta does).
    mine = checker.get_user_perms(provider).order_by()
    groups = checker.get_group_perms(provider).order_by()
    # django-stubs types union() for model querysets only; these are value lists.
    return frozenset(mine.union(groups))  # type: ignore[arg-type]


def provider_permissions_all(*, user: Any) -> dict[int, frozenset[str]]:
    """The permissions ``user`` holds on each provider (codenames), by provider id.

    ``provider_permissions`` for every provider at once, in one statement (guardian's
    user and group object permissions as one UNION): a page that asks what the user may
    do anywhere. A provider with none is absent.
    """
    if not user.is_active:
        return {}
    if user.is_superuser:
        everything = frozenset(permission.value for permission in ProviderPermission)
        return {pk: everything for pk in Provider.objects.values_list("pk", flat=True)}
    kind = ContentType.objects.get_for_model(Provider)
    mine = UserObjectPermission.objects.filter(user=user, content_type=kind).values_list(
        "object_pk", "permission__codename"
    )
    groups = GroupObjectPermission.objects.filter(
        group__in=user.groups.all(), content_type=kind
    ).values_list("object_pk", "permission__codename")
    held: dict[int, set[str]] = {}
    for pk, codename in mine.order_by().union(groups.order_by()):
        held.setdefault(int(pk), set()).add(codename)
    return {pk: frozenset(codenames) for pk, codenames in held.items()}


def approvals_for_approver(*, approver: Approver) -> QuerySet[Approval]:
    return Approval.objects.filter(approver.scope(provider="provider", host="host"))


def approvals_for_user(*, user: Any) -> QuerySet[Approval]:
    """Approvals of the providers whose operations ``user`` may view or decide."""
    names = providers_for_user(
        user=user,
        permissions=(ProviderPermission.VIEW_OPERATIONS, ProviderPermission.DECIDE_APPROVALS),
    )
    return Approval.objects.filter(provider__in=names.values("name"))


def approval_for_caller(
    *,
    approval_id: Any,
    approver: Approver | None = None,
    user: Any = None,
    host: Host | None = None,
) -> Approval:
    """One approval, for an approver, a console user or the host that opened it to read.

    Outside what the caller may see it does not exist (``unknown_approval``). Who may
    decide it is the deciding service's rule (``recovery.services.permits``).
    """
    if approver is not None:
        approvals = approvals_for_approver(approver=approver)
    elif host is not None:
        keys = operations_for_host(host=host).values("key")
        approvals = Approval.objects.filter(operation_key__in=keys)
    else:
        approvals = approvals_for_user(user=user)
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise NotFound(ErrorCode.UNKNOWN_APPROVAL, "no such approval")
    return approval


def provider_for_callback(*, name: str) -> Provider:
    """The provider a signed callback names (its signature is checked next)."""
    # PostgreSQL cannot even compare a text containing NUL: such a name names nothing.
    provider = None
    if "\x00" not in name and len(name) <= 100:
        provider = Provider.objects.filter(name=name).first()
    if provider is None:
        raise NotFound(ErrorCode.UNKNOWN_PROVIDER, "no such provider")
    return provider


def providers_supervised(*, user: Any) -> QuerySet[Provider]:
    """The providers ``user`` supervises: those on which it holds the supervisor role's
    own permission, ``approve_reconciliations``.

    The one spelling of "a supervisor": the four-eyes queue, bulk approvals, the
    dashboard and the audit trail's system chain all ask it.
    """
    return providers_for_user(user=user, permissions=(ProviderPermission.APPROVE_RECONCILIATIONS,))


def providers_visible_to(*, user: Any) -> QuerySet[Provider]:
    """Providers whose operations ``user`` may view."""
    return providers_for_user(user=user, permissions=(ProviderPermission.VIEW_OPERATIONS,))


def operation_for_user(*, user: Any, key: str) -> Operation | None:
    """One operation by key, or None when there is none or ``user`` may not view it."""
    return (
        Operation.objects.filter(key=key, provider__in=providers_visible_to(user=user))
        .select_related("provider", "host")
        .first()
    )


class UserRoles(NamedTuple):
    """What a user is anywhere, for what the console offers them and the passkey hold."""

    supervises: bool  # ``providers_supervised``: the dashboard, the system chain
    decides: bool  # ``decide_approvals`` on some provider: the approvals inbox
    acts: bool  # one of ``ACTING_PERMISSIONS`` somewhere: the queue's bulk selection


def user_roles(*, user: Any) -> UserRoles:
    """``UserRoles`` of ``user``, all three in one statement (none for a superuser,
    who is all three, or for someone signed out or inactive, who is none)."""
    if not user.is_authenticated or not user.is_active:
        return UserRoles(False, False, False)
    if user.is_superuser:
        return UserRoles(True, True, True)
    deciding = providers_for_user(user=user, permissions=(ProviderPermission.DECIDE_APPROVALS,))
    acting = providers_for_user(user=user, permissions=ACTING_PERMISSIONS)
    found = (
        get_user_model()
        .objects.filter(pk=user.pk)
        .values_list(Exists(providers_supervised(user=user)), Exists(deciding), Exists(acting))
        .first()
    )
    return (
        UserRoles(*(bool(answer) for answer in found)) if found else UserRoles(False, False, False)
    )


def supervises_any_provider(*, user: Any) -> bool:
    """Whether ``user`` is a supervisor: a superuser, or one who supervises at least one
    provider (``providers_supervised``).

    What it gates is every supervisor's, whichever providers they supervise: the audit
    trail's system chain (credential, provider and grant events, not per provider: a
    host token serves every provider), its alarms, and the people pages. ``user_roles``
    answers the same, with the other roles, for a page that asks all of them.
    """
    if user.is_superuser:
        return True
    return providers_supervised(user=user).exists()


def audit_alarms_for_user(*, user: Any) -> QuerySet[AuditAlarm]:
    """The alarms ``user`` may see and resolve, open or not, newest first.

    A superuser's are all of them. A supervisor's are those of the operation chains of
    the providers they supervise, and the system chain's, which every supervisor reads
    (``supervises_any_provider``); a chain no operation of theirs names (another provider's,
    or one no key names) is not theirs. Nobody else's.
    """
    alarms = AuditAlarm.objects.order_by("-raised_at", "-id")
    if not user.is_authenticated or not user.is_active:
        return alarms.none()
    if user.is_superuser:
        return alarms
    supervised = providers_supervised(user=user)
    chains = Operation.objects.filter(provider__in=supervised).values("key")
    # The system chain only for a supervisor: one who supervises no provider sees none.
    return alarms.filter(Q(chain__in=chains) | Q(chain="")).filter(Exists(supervised))
