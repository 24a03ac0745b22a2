"""Fetch-and-authorise: the operation, approval or proposal a request is about, for this
user and what they ask to do, or the refusal; and the 404 or 403 a service's refusal
stands for.

Each ``*_access`` helper answers as Zulip's ``access_stream_by_id`` does: the object, or
``Http404`` when the user may not see it (absent and hidden alike), or ``PermissionDenied``
when they may see it but not hold ``permission`` on its provider. A view calls one of them
first and never checks again: who may do what stays the services' rule
(``recovery.services.access``), asked here before a form or a confirmation page can answer
instead.
"""

from __future__ import annotations

import uuid

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from approvals.models import Approval, ReconciliationRequest
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from recovery.models import Operation
from recovery.permissions import ProviderPermission
from recovery.selectors.access import UserRoles, approval_for_caller, operation_for_user, user_roles
from recovery.selectors.reconciliations import reconciliation_request_for_user
from recovery.services.access import provider_permission_require
from recovery.services.errors import NotFound, RecoveryError
from recovery.services.operator import operator_permitted


def operation_access(
    request: HttpRequest,
    key: str,
    *,
    permission: ProviderPermission | None = None,
    action: str = "",
) -> Operation:
    """The operation named ``key`` if this user may view it, and may ``action`` it when
    ``permission`` is given; else 404 (absent or hidden) or 403.

    The 403 is the operator services' own check (``operator_permitted``), so the refusal
    is on the operation's chain whether the form was filled or not.
    """
    operation = operation_for_user(user=request.user, key=key)
    if operation is None:
        raise Http404("no such operation")
    if permission is not None:
        _operator_permitted(request, operation, action, permission)
    return operation


def approval_access(
    request: HttpRequest, approval_id: uuid.UUID, *, permission: ProviderPermission | None = None
) -> Approval:
    """The approval if this user may see it (view or decide on its provider), and holds
    ``permission`` on its provider when given; else 404 or 403.

    As the deciding service's refusal of one who may only view (``approval_decision``),
    the 403 is not on the record.
    """
    try:
        approval = approval_for_caller(approval_id=approval_id, user=request.user)
        if permission is not None:
            operation = Operation.objects.select_related("provider").get(key=approval.operation_key)
            provider_permission_require(
                actor=Actor.of("user", request.user),
                provider=operation.provider,
                permission=permission,
                action="approve or deny",
                visible=(ProviderPermission.VIEW_OPERATIONS, ProviderPermission.DECIDE_APPROVALS),
                missing=ErrorCode.UNKNOWN_APPROVAL,
            )
    except (NotFound, Operation.DoesNotExist):
        raise Http404("no such approval") from None
    except RecoveryError as refusal:
        raise PermissionDenied(refusal.message) from refusal
    return approval


def reconciliation_access(
    request: HttpRequest,
    request_id: int,
    *,
    permission: ProviderPermission | None = None,
    action: str = "",
) -> tuple[ReconciliationRequest, Operation]:
    """The proposal and its operation if this user may view it, and may ``action`` it when
    ``permission`` is given; else 404 (absent or hidden) or 403, recorded as
    ``operation_access``'s."""
    found = reconciliation_request_for_user(user=request.user, request_id=request_id)
    if found is None:
        raise Http404("no such reconciliation request")
    if permission is not None:
        _operator_permitted(request, found[1], action, permission)
    return found


def _operator_permitted(
    request: HttpRequest, operation: Operation, action: str, permission: ProviderPermission
) -> None:
    actor = Actor.of("user", request.user)
    try:
        operator_permitted(operation=operation, action=action, permission=permission, actor=actor)
    except RecoveryError as refusal:
        refusal_status_raise(refusal)
        raise


def request_roles(request: HttpRequest) -> UserRoles:
    """What the user is (``user_roles``): the navigation's answer, and the pages' for
    supervisors and deciders (the dashboard, the policy).

    Asked once per request (the answer is kept on it), by whichever reads it first, or
    by the passkey middleware before them: one statement for all of them.
    """
    if not hasattr(request, "_settle_roles"):
        request._settle_roles = user_roles(user=request.user)  # type: ignore[attr-defined]
    return request._settle_roles  # type: ignore[attr-defined,no-any-return]


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
