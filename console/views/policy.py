"""The approval policy in force, read-only: the file is changed with ``manage.py policy``.

For supervisors of a provider (and superusers), as the dashboard is: a policy's rules
say how much an agent may spend without a person, which is theirs to know.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.selectors.dashboard import dashboard_providers_for_user
from policies.selectors import budgets_in_use, policy_in_force
from policies.services import policy_current


@login_required
@require_safe
def policy(request: HttpRequest) -> HttpResponse:
    supervised = dashboard_providers_for_user(user=request.user)
    if not supervised and not request.user.is_superuser:
        raise PermissionDenied("The policy is for supervisors of a provider.")
    applied = policy_in_force()
    parsed = policy_current()
    names = None if request.user.is_superuser else {provider.name for provider in supervised}
    return render(
        request,
        "console/policy.html",
        {
            "applied": applied,
            "policy": parsed,
            "budgets": budgets_in_use(providers=names),
        },
    )
