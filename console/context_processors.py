"""Template context every console page shares."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from recovery.audit import audit_alarms_open
from recovery.models import AuditAlarm
from recovery.selectors import audit_supervisor
from recovery.selectors.dashboard import dashboard_providers_for_user


def _alarms_for(request: HttpRequest) -> list[AuditAlarm]:
    """Open audit alarms, for supervisors only: an alarm names chains of any provider.

    The alarms are read first: almost always there are none, and then the supervisor
    check costs nothing.
    """
    user = request.user
    if not user.is_authenticated:
        return []
    alarms = list(audit_alarms_open()[:5])
    if not alarms or not audit_supervisor(user=user):
        return []
    return alarms


def audit_alarms(request: HttpRequest) -> dict[str, Any]:
    """``audit_alarms``: read only by a page that shows the banner (not by htmx partials)."""
    return {"audit_alarms": SimpleLazyObject(lambda: _alarms_for(request))}


def supervises(request: HttpRequest) -> dict[str, Any]:
    """``supervises``: whether the nav offers the dashboard (read only where it is shown).

    The dashboard's own view checks again: hiding a link is not a permission.
    """
    return {"supervises": SimpleLazyObject(lambda: _supervises(request))}


def _supervises(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_authenticated and dashboard_providers_for_user(user=user))
