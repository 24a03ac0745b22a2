"""Access helpers: the operation a request is about, for this user, or 404; and the 404 or
403 a service's refusal stands for.

Who may do what is the services' rule (``recovery.services.access``): a view fetches what
the user may see, calls the service, and answers a refusal with the status its code
carries (``common.errors.ErrorCode``), as the host API does.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from common.actors import Actor
from common.errors import ErrorCode, SettleError
from recovery.models import Operation
from recovery.permissions import ProviderPermission
from recovery.selectors import operation_for_user
from recovery.services.errors import RecoveryError
from recovery.services.operator import operator_permitted


def operation_for_viewer(request: HttpRequest, key: str) -> Operation:
    """The operation named ``key`` if this user may view it; 404 whether absent or hidden."""
    operation = operation_for_user(user=request.user, key=key)
    if operation is None:
        raise Http404("no such operation")
    return operation


def refusal_status_raise(refusal: SettleError) -> None:
    """Raise the 404 or 403 that ``refusal`` stands for; any other refusal is the page's to show.

    A user who may not see the provider gets 404, one who may see but not do gets 403
    (the service has recorded that refusal already). A decision the policy does not
    count (unsigned where a passkey is required, the proposer's, one outside its
    groups) is the decider's to read on the page, with its code.
    """
    if refusal.code.status == 404:
        raise Http404(refusal.message) from refusal
    if refusal.code == ErrorCode.FORBIDDEN:
        raise PermissionDenied(refusal.message) from refusal


def permission_checked(
    request: HttpRequest, operation: Operation, action: str, permission: ProviderPermission
) -> None:
    """The service's own check of ``permission``, for a view that answers before it.

    A form that fails validation, or a void that first asks to be confirmed, never
    reaches its service; a user who may not act at all still gets 403, recorded, rather
    than an invitation to correct the form or to confirm.
    """
    actor = Actor.of("user", request.user)
    try:
        operator_permitted(operation=operation, action=action, permission=permission, actor=actor)
    except RecoveryError as refusal:
        refusal_status_raise(refusal)
        raise
