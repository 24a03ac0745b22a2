"""One operation, as a user who may view its provider sees it, and what they may do to it."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from common.actors import Actor
from console.forms import ActionForm
from console.views.access import operation_access, refusal_status_raise
from console.views.reconcile import actions_context
from recovery.models import LookupAttempt
from recovery.permissions import ProviderPermission
from recovery.selectors.operation_page import (
    operation_comparison,
    operation_page,
    operation_viewed_for_user,
    permit_history_older,
)
from recovery.services.errors import RecoveryError
from recovery.services.operator import operator_lookup


def _seen(attempt: LookupAttempt) -> str:
    """What a polling page shows of the lookup in flight: which one, and how far along."""
    return f"{attempt.pk}.{attempt.status}"


@login_required
@require_safe
def operation_detail(request: HttpRequest, key: str) -> HttpResponse:
    """The whole record of one operation, its history, and what differs in its evidence.

    While a lookup of it is in flight, the page's ``#live`` region (evidence, receipt,
    history) polls this view. A poll that finds the same lookup as the page shows gets
    204, which htmx leaves on screen; any other answer is the region, redrawn, and once
    no lookup is in flight it carries no trigger, so the polling stops there.
    """
    # The lookup in flight is read before the operation (operation_viewed_for_user).
    viewed = operation_viewed_for_user(user=request.user, key=key)
    if viewed is None:
        raise Http404("no such operation")
    polled = bool(request.htmx) and request.htmx.target == "live"  # type: ignore[attr-defined]
    in_flight = viewed.in_flight
    if polled and in_flight is not None and request.GET.get("seen") == _seen(in_flight):
        return HttpResponse(status=204)
    page = operation_page(viewed=viewed)
    context = {
        "operation": page.operation,
        "record": page.record,
        "comparison": operation_comparison(record=page.record),
        "timeline": page.timeline,
        "permits": page.permits,
        "in_flight": in_flight,
        "finished": polled and in_flight is None,
        "oob": polled,
        **actions_context(request, page),
        "seen": _seen(in_flight) if in_flight is not None else "",
    }
    template = "console/operation.html#live" if polled else "console/operation.html"
    return render(request, template, context)


@login_required
@require_safe
def permit_history_view(request: HttpRequest, key: str, permit_id: str) -> HttpResponse:
    """A page of a permit's older lines, ``before`` the cursor the operation page gave.

    For htmx, the lines alone, which replace the "Older lines" link they follow.
    """
    operation = operation_access(request, key)
    before = request.GET.get("before", "")
    if not (before.isascii() and before.isdigit() and len(before) <= 18):
        return HttpResponseBadRequest("invalid_cursor: before must be the cursor of a link")
    try:
        pk = uuid.UUID(permit_id)
    except ValueError:
        raise Http404("no such permit") from None
    history = permit_history_older(operation=operation, permit_id=pk, before=int(before))
    if history is None:
        raise Http404("no such permit")
    context = {"record": {"key": operation.key}, "permit": history}
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "console/operation.html#permit-lines", context)
    return render(request, "console/permit_history.html", context)


@login_required
@require_POST
def operation_lookup(request: HttpRequest, key: str) -> HttpResponse:
    """Queue a lookup of the evidence now, with a reason, as of the version the operator saw."""
    operation = operation_access(
        request, key, permission=ProviderPermission.LOOKUP_OPERATIONS, action="lookup"
    )
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
        refusal_status_raise(exc)
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
