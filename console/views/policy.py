"""The approval policy in force, read-only: the file is changed with ``manage.py policy``.

For supervisors of a provider, the people who decide approvals (an approval's page names
its rule) and superusers: a policy's rules say how much an agent may spend without a
person, which is theirs to know.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.views.access import request_roles
from policies.selectors import budgets_in_use, policy_in_force
from policies.services import policy_parsed
from recovery.permissions import ProviderPermission
from recovery.selectors.access import providers_for_user


@login_required
@require_safe
def policy(request: HttpRequest) -> HttpResponse:
    roles = request_roles(request)
    if not (roles.supervises or roles.decides):
        raise PermissionDenied("The policy is for supervisors and the people who decide.")
    applied = policy_in_force()
    parsed = policy_parsed(applied)
    names = None if request.user.is_superuser else _providers_read(request)
    return render(
        request,
        "console/policy.html",
        {
            "applied": applied,
            "policy": parsed,
            "budgets": budgets_in_use(providers=names, policy=parsed),
        },
    )


def _providers_read(request: HttpRequest) -> set[str]:
    """The providers whose budgets the page shows: those the user supervises or decides for."""
    reading = providers_for_user(
        user=request.user,
        permissions=(
            ProviderPermission.APPROVE_RECONCILIATIONS,
            ProviderPermission.DECIDE_APPROVALS,
        ),
    )
    return set(reading.values_list("name", flat=True))
