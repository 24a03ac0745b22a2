"""Template context every console page shares."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from audit.alarms import audit_alarms_open
from audit.models import AuditAlarm
from recovery.permissions import ProviderPermission
from recovery.selectors import audit_alarms_for_user, providers_for_user, providers_supervised


def _roles(request: HttpRequest) -> tuple[bool, bool]:
    """Whether the user supervises (the alarm banner, the dashboard's link) and whether
    they may decide approvals anywhere (the inbox's link).

    Asked once per request (the answer is kept on it), by whichever the page reads
    first, both in one statement: a page pays one statement for all three. Where the
    passkey middleware has asked whether the user supervises, only the other is asked.
    """
    if hasattr(request, "_settle_roles"):
        return request._settle_roles  # type: ignore[no-any-return]
    user = request.user
    roles = (False, False)
    if user.is_authenticated and user.is_superuser:
        roles = (True, True)
    elif user.is_authenticated and user.is_active:
        deciding = providers_for_user(user=user, permissions=(ProviderPermission.DECIDE_APPROVALS,))
        known = getattr(request, "_settle_supervising", None)
        if known is not None:
            roles = (bool(known), deciding.exists())
        else:
            found = (
                get_user_model()
                .objects.filter(pk=user.pk)
                .values_list(Exists(providers_supervised(user=user)), Exists(deciding))
                .first()
            )
            roles = (bool(found[0]), bool(found[1])) if found else roles
    request._settle_roles = roles  # type: ignore[attr-defined]
    return roles


def _supervising(request: HttpRequest) -> bool:
    return _roles(request)[0]


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
    return {"decides": SimpleLazyObject(lambda: _roles(request)[1])}
