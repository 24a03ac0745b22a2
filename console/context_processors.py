"""Template context every console page shares."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from audit.alarms import audit_alarms_open
from audit.models import AuditAlarm
from console.views.access import request_roles
from recovery.selectors.access import audit_alarms_for_user


def _supervising(request: HttpRequest) -> bool:
    return request_roles(request).supervises


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
    permission on a provider, or a superuser). The dashboard's view asks the same
    answer itself: hiding a link is not a permission.
    """
    return {"supervises": SimpleLazyObject(lambda: _supervising(request))}


def decides(request: HttpRequest) -> dict[str, Any]:
    """``decides``: whether the navigation offers the approvals inbox.

    Read with ``supervises``, in its statement. The inbox lists only what the user may
    decide whatever the link says.
    """
    return {"decides": SimpleLazyObject(lambda: request_roles(request).decides)}


def acts(request: HttpRequest) -> dict[str, Any]:
    """``acts``: whether the queue offers its selection and bulk actions (a viewer's
    batch could only be refused). Read with ``supervises``, in its statement; the bulk
    service checks each item's own permission whatever the page offered."""
    return {"acts": SimpleLazyObject(lambda: request_roles(request).acts)}
