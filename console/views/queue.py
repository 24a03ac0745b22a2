"""The queue: what waits for an operator, of the providers the user may view."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_safe
from django_htmx.http import HttpResponseClientRedirect

from console.forms import QueueFilterForm, cursor_encode, page_queries
from recovery.selectors.access import providers_visible_to
from recovery.selectors.jump import operation_jump_for_user
from recovery.selectors.queue import operations_queue_for_user

PAGE_SIZE = 50


@login_required
@require_safe
def home(request: HttpRequest) -> HttpResponse:
    """The queue, filtered by the URL; htmx swaps only the results.

    A submitted search that names one visible operation exactly (its key, a permit or
    approval id, a provider reference) opens that operation instead.
    """
    providers = list(providers_visible_to(user=request.user).values_list("name", flat=True))
    form = QueueFilterForm(request.GET, providers=sorted(providers))
    form.is_valid()  # an invalid filter is dropped and shown; the rest still apply
    data = getattr(form, "cleaned_data", {})
    if data.get("jump") and data.get("q", "").strip():
        key = operation_jump_for_user(user=request.user, text=data["q"].strip())
        if key is not None:
            if request.htmx:  # type: ignore[attr-defined]
                # The whole page goes, not the results pane: the browser navigates.
                return HttpResponseClientRedirect(reverse("operation", args=[key]))
            return redirect("operation", key=key)
    page = operations_queue_for_user(
        user=request.user,
        filters=form.filters(),
        after=data.get("after"),
        limit=PAGE_SIZE,
        counted=True,  # by the same statement
    )
    cursor = cursor_encode(page.next_after) if page.next_after is not None else None
    context = {
        "form": form,
        "page": page,
        "counts": page.counts,
        "has_providers": bool(providers),
        **page_queries(request.GET, cursor),
    }
    template = "console/queue.html#results" if request.htmx else "console/queue.html"  # type: ignore[attr-defined]
    return render(request, template, context)
