"""One operation, as a user who may view its provider sees it."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from recovery.models import Operation
from recovery.selectors import operation_for_user, operation_record


def _operation_for_viewer(request: HttpRequest, key: str) -> Operation:
    """The operation named ``key`` if this user may view it; 404 whether absent or hidden."""
    operation = operation_for_user(user=request.user, key=key)
    if operation is None:
        raise Http404("no such operation")
    return operation


@login_required
@require_safe
def operation_detail(request: HttpRequest, key: str) -> HttpResponse:
    """The whole record of one operation, read-only: the host API's record of it."""
    operation = _operation_for_viewer(request, key)
    context = {"operation": operation, "record": operation_record(operation=operation)}
    return render(request, "console/operation.html", context)
