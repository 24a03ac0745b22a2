"""Access helpers: the operation a request is about, for this user, or 404 / 403."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from approvals.actors import Actor
from recovery.models import Operation
from recovery.selectors import operation_for_user, provider_permitted
from recovery.services.operator import operator_refusal_record


def operation_for_viewer(request: HttpRequest, key: str) -> Operation:
    """The operation named ``key`` if this user may view it; 404 whether absent or hidden."""
    operation = operation_for_user(user=request.user, key=key)
    if operation is None:
        raise Http404("no such operation")
    return operation


def operation_for_action(request: HttpRequest, key: str, action: str, permission: str) -> Operation:
    """The operation, if this user may view it (else 404) and act on it (else 403, recorded)."""
    operation = operation_for_viewer(request, key)
    permission_required(request, operation, action, permission)
    return operation


def permission_required(
    request: HttpRequest, operation: Operation, action: str, permission: str
) -> None:
    """403 unless this user holds ``permission`` on the operation's provider; recorded."""
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
