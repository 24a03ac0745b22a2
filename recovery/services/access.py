"""Who may act on a provider's operations: the check every service acting for someone makes.

A console user (an actor of kind ``user``) holds object permissions per provider
(``recovery.permissions``). A provider whose operations they may not see does not exist
for them: ``NotFound``, never recorded (a refusal on a chain they cannot read would tell
them it exists). One they may see but not act on is ``Forbidden``; the operator services
record that refusal on the operation's chain (``operator_refused``).

Settle itself (kind ``system``: a command, the sweeper) acts on every provider. Hosts,
approvers and providers hold no provider permission: to them the operation is unknown.
An approver's own rule is its scope (``Approver.scope``), applied where it looks up.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Provider
from recovery.permissions import ProviderPermission
from recovery.selectors.access import provider_permissions
from recovery.services.errors import Forbidden, NotFound

ALL = frozenset(ProviderPermission)


def actor_user(actor: Actor) -> Any:
    """The console user ``actor`` names, or None (another kind, or a user since deleted)."""
    if actor.kind != "user" or not actor.id.isdigit():
        return None
    return get_user_model().objects.filter(pk=int(actor.id)).first()


def actor_permissions(*, actor: Actor, provider: Provider) -> frozenset[str]:
    """The permissions ``actor`` holds on ``provider`` (all of them for Settle itself)."""
    if actor.kind == "system":
        return ALL
    user = actor_user(actor)
    if user is None:
        return frozenset()
    return provider_permissions(user=user, provider=provider)


def provider_permission_require(
    *,
    actor: Actor,
    provider: Provider,
    permission: ProviderPermission,
    action: str,
    visible: tuple[ProviderPermission, ...] = (ProviderPermission.VIEW_OPERATIONS,),
    missing: ErrorCode = ErrorCode.UNKNOWN_OPERATION,
) -> frozenset[str]:
    """Refuse unless ``actor`` holds ``permission`` on ``provider``; what it holds, if so.

    ``NotFound(missing)`` unless it holds one of ``visible`` (what makes the thing exist
    for it), else ``Forbidden`` naming ``action``. Returns everything held, for a
    service whose rule needs a second permission.
    """
    held = actor_permissions(actor=actor, provider=provider)
    if not held & set(visible):
        raise NotFound(missing, f"no such {missing.value.removeprefix('unknown_')}")
    if permission not in held:
        raise Forbidden(f"you may not {action} this provider's operations")
    return held
