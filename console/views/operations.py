"""One operation, as a user who may view its provider sees it, and what they may do to it."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from approvals.actors import Actor
from console.forms import ActionForm
from recovery.models import Operation
from recovery.selectors import (
    lookup_in_flight,
    operation_comparison,
    operation_for_user,
    operation_permit_history,
    operation_record,
    operation_timeline,
    provider_permitted,
)
from recovery.services.errors import RecoveryError
from recovery.services.operator import operator_lookup, operator_refusal_record


def _operation_for_viewer(request: HttpRequest, key: str) -> Operation:
    """The operation named ``key`` if this user may view it; 404 whether absent or hidden."""
    operation = operation_for_user(user=request.user, key=key)
    if operation is None:
        raise Http404("no such operation")
    return operation


@login_required
@require_safe
def operation_detail(request: HttpRequest, key: str) -> HttpResponse:
    """The whole record of one operation, its history, and what differs in its evidence.

    While a lookup of it is in flight, the evidence and history (``#live``) poll this
    view, which answers htmx's ``#live`` requests with that region alone; the answer
    that finds no lookup in flight carries no trigger, so the polling stops there.
    """
    operation = _operation_for_viewer(request, key)
    polled = bool(request.htmx) and request.htmx.target == "live"  # type: ignore[attr-defined]
    # Read before the record: a lookup that ends in between is then seen finished in the
    # record and polled once more, never seen over while the record predates its answer.
    in_flight = lookup_in_flight(operation=operation)
    record = operation_record(operation=operation)
    context = {
        "operation": operation,
        "record": record,
        "comparison": operation_comparison(record=record),
        "timeline": operation_timeline(operation=operation),
        "permits": operation_permit_history(operation=operation),
        "in_flight": in_flight,
        "finished": polled and in_flight is None,
        "oob": polled,
        "may_lookup": provider_permitted(
            user=request.user, permission="lookup_operations", provider=operation.provider
        ),
        "action_form": ActionForm(initial={"version": operation.version}),
    }
    template = "console/operation.html#live" if polled else "console/operation.html"
    return render(request, template, context)


def _operation_for_action(
    request: HttpRequest, key: str, action: str, permission: str
) -> Operation:
    """The operation, if this user may view it (else 404) and act on it (else 403, recorded)."""
    operation = _operation_for_viewer(request, key)
    if not provider_permitted(
        user=request.user, permission=permission, provider=operation.provider
    ):
        operator_refusal_record(
            operation=operation,
            action=action,
            code="forbidden",
            actor=Actor.of("user", request.user),
        )
        raise PermissionDenied(f"you may not {action} this provider's operations")
    return operation


@login_required
@require_POST
def operation_lookup(request: HttpRequest, key: str) -> HttpResponse:
    """Look the evidence up now, with a reason, as of the version the operator saw."""
    operation = _operation_for_action(request, key, "lookup", "lookup_operations")
    form = ActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Nothing was done: give a reason for the lookup.")
        return redirect("operation", key=key)
    try:
        looked_up = operator_lookup(
            operation=operation,
            version=form.cleaned_data["version"],
            reason=form.cleaned_data["reason"],
            actor=Actor.of("user", request.user),
        )
    except RecoveryError as exc:
        messages.error(request, f"Refused: {exc.message}.")
    else:
        messages.success(request, f"Looked up: the operation is {looked_up.state}.")
    return redirect("operation", key=key)
