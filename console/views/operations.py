"""One operation, as a user who may view its provider sees it, and what they may do to it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from approvals.actors import Actor
from console.forms import ActionForm
from console.views.access import operation_for_action, operation_for_viewer
from console.views.reconcile import actions_context
from recovery.selectors import operation_record
from recovery.services.errors import RecoveryError
from recovery.services.operator import operator_lookup


@login_required
@require_safe
def operation_detail(request: HttpRequest, key: str) -> HttpResponse:
    """The whole record of one operation, read-only: the host API's record of it."""
    operation = operation_for_viewer(request, key)
    context = {
        "operation": operation,
        "record": operation_record(operation=operation),
        **actions_context(request, operation),
    }
    return render(request, "console/operation.html", context)


@login_required
@require_POST
def operation_lookup(request: HttpRequest, key: str) -> HttpResponse:
    """Queue a lookup of the evidence now, with a reason, as of the version the operator saw."""
    operation = operation_for_action(request, key, "lookup", "lookup_operations")
    form = ActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Nothing was done: give a reason for the lookup.")
        return redirect("operation", key=key)
    try:
        queued = operator_lookup(
            operation=operation,
            version=form.cleaned_data["version"],
            reason=form.cleaned_data["reason"],
            actor=Actor.of("user", request.user),
        )
    except RecoveryError as exc:
        messages.error(request, f"Refused: {exc.message}.")
    else:
        if queued.published:
            messages.success(
                request, "Queued: a background worker looks it up now; this page shows the answer."
            )
        else:
            messages.warning(
                request,
                "Queued, but the background workers could not be reached: it will be looked "
                "up once they are (or ask again in a minute).",
            )
    return redirect("operation", key=key)
