"""Template context every console page shares."""

from __future__ import annotations

from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.db.models import Exists
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from audit.alarms import audit_alarms_open
from audit.models import AuditAlarm
from bulk.services import ACTION_PERMISSIONS
from recovery.permissions import ProviderPermission
from recovery.selectors import audit_alarms_for_user, providers_for_user, providers_supervised


class Roles(NamedTuple):
    supervises: bool  # the alarm banner, the dashboard's link
    decides: bool  # the inbox's link
    acts: bool  # the queue's selection and bulk actions: more than viewing somewhere


# What a bulk batch can ask on a provider (``bulk.services``), any of them.
_ACTING = tuple({p for needed in ACTION_PERMISSIONS.values() for p in needed})


def _roles(request: HttpRequest) -> Roles:
    """What the user is, for what the pages offer them.

    Asked once per request (the answer is kept on it), by whichever the page reads
    first, all in one statement: a page pays one statement for all of them. Where the
    passkey middleware has asked whether the user supervises, only the others are asked.
    """
    if hasattr(request, "_settle_roles"):
        return request._settle_roles  # type: ignore[no-any-return]
    user = request.user
    roles = Roles(False, False, False)
    if user.is_authenticated and user.is_superuser:
        roles = Roles(True, True, True)
    elif user.is_authenticated and user.is_active:
        deciding = providers_for_user(user=user, permissions=(ProviderPermission.DECIDE_APPROVALS,))
        acting = providers_for_user(user=user, permissions=_ACTING)
        known = getattr(request, "_settle_supervising", None)
        asked = [Exists(deciding), Exists(acting)]
        if known is None:
            asked.insert(0, Exists(providers_supervised(user=user)))
        found = get_user_model().objects.filter(pk=user.pk).values_list(*asked).first()
        if found:
            answers = [bool(known), *found] if known is not None else list(found)
            roles = Roles(*(bool(answer) for answer in answers))
    request._settle_roles = roles  # type: ignore[attr-defined]
    return roles


def _supervising(request: HttpRequest) -> bool:
    return _roles(request).supervises


def _alarms_for(request: HttpRequest) -> list[AuditAlarm]:
    """The newest open audit alarms the user may see: supervisors only, their providers'.

    Whether the user supervises is asked first, as the navigation asks it anyway; only
    a supervisor's page then reads the alarms. A superuser's are every alarm; another
    supervisor's only their providers' chains' and the system chain's
    (``audit_alarms_for_user``).
    """
    if not _supervising(request):
        return []
    if request.user.is_superuser:
        return list(audit_alarms_open()[:5])
    return list(audit_alarms_for_user(user=request.user).filter(resolved_at__isnull=True)[:5])


def audit_alarms(request: HttpRequest) -> dict[str, Any]:
    """``audit_alarms``: read only by a page that shows the banner (not by htmx partials)."""
    return {"audit_alarms": SimpleLazyObject(lambda: _alarms_for(request))}


def supervises(request: HttpRequest) -> dict[str, Any]:
    """``supervises``: whether the navigation offers the dashboard.

    The supervisors of the audit trail are the dashboard's (the supervisor role's own
    permission on a provider, or a superuser). The dashboard's view checks again:
    hiding a link is not a permission.
    """
    return {"supervises": SimpleLazyObject(lambda: _supervising(request))}


def decides(request: HttpRequest) -> dict[str, Any]:
    """``decides``: whether the navigation offers the approvals inbox.

    Read with ``supervises``, in its statement. The inbox lists only what the user may
    decide whatever the link says.
    """
    return {"decides": SimpleLazyObject(lambda: _roles(request).decides)}


def acts(request: HttpRequest) -> dict[str, Any]:
    """``acts``: whether the queue offers its selection and bulk actions (a viewer's
    batch could only be refused). Read with ``supervises``, in its statement; the bulk
    service checks each item's own permission whatever the page offered."""
    return {"acts": SimpleLazyObject(lambda: _roles(request).acts)}
