"""Settling an operation by hand: confirm, void, repair, four-eyes requests, claims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from approvals.models import ReconciliationRequest
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from common.statements import statement
from console.forms import ActionForm, DecisionForm
from console.views.access import operation_access, reconciliation_access, refusal_status_raise
from console.views.signing import json_refusal, signed_record, signing_begin
from identity.selectors import passkey_held
from policies.services import passkey_required_for, policy_current
from recovery.models import Dispatch, Operation, State, receipt_stranded
from recovery.permissions import ProviderPermission
from recovery.selectors.access import provider_permissions, providers_supervised
from recovery.selectors.operation_page import OperationPage
from recovery.selectors.reconciliations import reconciliation_requests_for_user
from recovery.services.errors import RecoveryError
from recovery.services.four_eyes import (
    reconciliation_approve,
    reconciliation_reject,
    reconciliation_subject,
)
from recovery.services.operator import operation_claim, operation_claim_release
from recovery.services.reconcile import (
    DECISION_PERMISSIONS,
    decision_route,
    evidence_latest,
    operation_reconcile,
    reconcile_grounds,
)

# The decisions an operator takes from the page; each one's permission is the service's.
DECISIONS = DECISION_PERMISSIONS
PAST = {"confirm": "Confirmed", "void": "Voided", "repair": "Repaired the receipt"}


def _actor(request: HttpRequest) -> Actor:
    return Actor.of("user", request.user)


def actions_context(request: HttpRequest, page: OperationPage) -> dict[str, Any]:
    """What the operation page offers this user: each decision, its claim, its proposal.

    A decision is listed only if the user holds its permission and the operation allows
    it now, with whether it is taken at once (the evidence backs it) or proposed.
    """
    operation, evidence, dispatch = page.operation, page.evidence_latest, page.dispatch
    held = provider_permissions(user=request.user, provider=operation.provider)
    decisions = []
    for action, permission in DECISIONS.items():
        if permission not in held:
            continue
        try:
            backing = decision_route(
                operation=operation, action=action, held=held, evidence=evidence, dispatch=dispatch
            )
        except RecoveryError:
            continue
        decisions.append({"action": action, "direct": backing is not None})
    pending = page.pending_request
    if pending is not None:  # one proposal at a time: it is decided first
        decisions = []
    may_lookup = ProviderPermission.LOOKUP_OPERATIONS in held
    may_approve = pending is not None and ProviderPermission.APPROVE_RECONCILIATIONS in held
    return {
        "may_lookup": may_lookup,
        "decisions": decisions,
        "claim": page.claim,
        "may_claim": may_lookup,
        "me": _actor(request),
        "pending_request": pending,
        "may_approve": may_approve,
        # Asked only of one who may decide: the page's statement count stays for others.
        **(
            {
                "has_passkey": passkey_held(user=request.user),
                "must_sign": passkey_required_for([operation.provider.name]),
            }
            if may_approve and pending is not None and pending.proposed_by != _actor(request)
            else {}
        ),
        **_outcomes(operation, dispatch),
    }


def _outcomes(operation: Operation, dispatch: Dispatch | None) -> dict[str, Any]:
    """What a decision does besides the transition, for the sentence beside its button."""
    return {
        # A confirm or a void completes a stranded receipt too (``apply_decision``).
        "stranded": dispatch is not None
        and receipt_stranded(state=operation.state, receipt_status=dispatch.receipt_status),
        # A repair completes it as the settled state says.
        "repair_as": "succeeded" if operation.state == State.RELEASED else "failed",
    }


@login_required
@require_POST
def operation_decide(request: HttpRequest, key: str, action: str) -> HttpResponse:
    """Confirm, void or repair as of the version seen: now if backed, else proposed."""
    operation = operation_access(request, key, permission=DECISIONS[action], action=action)
    form = ActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Nothing was done: give a reason to {action}.")
        return redirect("operation", key=key)
    if action == "void" and not form.cleaned_data["confirmed"]:
        asked = _void_confirmation(request, operation, form)
        if asked is not None:
            return asked
    try:
        decided = operation_reconcile(
            operation=operation,
            action=action,
            version=form.cleaned_data["version"],
            reason=form.cleaned_data["reason"],
            actor=_actor(request),
        )
    except RecoveryError as exc:
        refusal_status_raise(exc)
        messages.error(request, f"Refused: {exc.message}.")
    else:
        if decided.proposed:
            messages.success(
                request,
                f"Proposed: the {action} waits for a second operator's approval "
                "(the evidence does not back it alone).",
            )
        else:
            state = decided.operation.state
            messages.success(request, f"{PAST[action]}: the operation is {state}.")
    return redirect("operation", key=key)


def _void_confirmation(
    request: HttpRequest, operation: Operation, form: ActionForm
) -> HttpResponse | None:
    """The page that asks before a void, saying what it will do; None to go on at once.

    A void that could not be taken anyway (the page was stale, or the evidence rules it
    out) is not asked about: the service refuses it, and records the refusal, as before.
    """
    if form.cleaned_data["version"] != operation.version:
        return None
    evidence = evidence_latest(operation)
    dispatch = Dispatch.of(operation)
    try:
        backing = reconcile_grounds(
            operation=operation, action="void", evidence=evidence, dispatch=dispatch
        )
    except RecoveryError:
        return None
    context = {
        "operation": operation,
        "evidence": evidence,
        "direct": backing is not None,
        "reason": form.cleaned_data["reason"],
        "version": operation.version,
        **_outcomes(operation, dispatch),
    }
    return render(request, "console/operation_void.html", context)


def _claim_step(
    request: HttpRequest, key: str, action: str, step: Callable[..., Any], done: str
) -> HttpResponse:
    """Take or release a claim (``step``); the refusal or ``done`` shown on the page.

    Claiming is working on it: it needs what a lookup needs (``operation_claim``).
    """
    operation = operation_access(
        request, key, permission=ProviderPermission.LOOKUP_OPERATIONS, action=action
    )
    try:
        step(operation=operation, actor=_actor(request))
    except RecoveryError as exc:
        refusal_status_raise(exc)
        messages.error(request, f"Refused: {exc.message}.")
    else:
        messages.success(request, done)
    return redirect("operation", key=key)


@login_required
@require_POST
def operation_claim_view(request: HttpRequest, key: str) -> HttpResponse:
    """Claim the operation, so that other operators leave it to you."""
    return _claim_step(
        request,
        key,
        "claim",
        operation_claim,
        "Claimed: it is yours until you release it or go idle.",
    )


@login_required
@require_POST
def operation_release_view(request: HttpRequest, key: str) -> HttpResponse:
    """Let go of your claim on the operation."""
    return _claim_step(
        request, key, "release", operation_claim_release, "Released: anyone may work on it now."
    )


@login_required
@require_safe
def reconciliations(request: HttpRequest) -> HttpResponse:
    """The four-eyes queue: pending proposals, oldest first, with their evidence inline."""
    rows = reconciliation_requests_for_user(user=request.user)
    approvable = set(providers_supervised(user=request.user).values_list("pk", flat=True))
    signed = policy_current().passkey_providers if rows else frozenset()
    context = {
        # Each proposal, and whether the policy counts only signed decisions on it.
        "rows": [(row, row.operation.provider.name in signed) for row in rows],
        "has_passkey": bool(rows) and passkey_held(user=request.user),
        "approvable": approvable,
        "me": _actor(request),
        "form": DecisionForm(),
    }
    return render(request, "console/reconciliations.html", context)


@login_required
@require_POST
def reconciliation_decide(request: HttpRequest, request_id: int, decision: str) -> HttpResponse:
    """Approve (and so take) or reject another operator's proposal, with a reason."""
    proposal, operation = reconciliation_access(
        request, request_id, permission=ProviderPermission.APPROVE_RECONCILIATIONS, action=decision
    )
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Nothing was done: give a reason to {decision}.")
        return redirect("reconciliations")
    service = reconciliation_approve if decision == "approve" else reconciliation_reject
    try:
        signature = signed_record(
            request,
            kind="reconciliation",
            subject=proposal.pk,
            decision=decision,
            operation_key=operation.key,
        )
        service(
            operation=operation,
            request_id=proposal.pk,
            reason=form.cleaned_data["reason"],
            actor=_actor(request),
            signature=signature,
        )
    except SettleError as exc:  # the service's refusal, or the signature's (passkey_signing)
        refusal_status_raise(exc)
        messages.error(request, f"Refused ({exc.code.value}): {exc.message}. Nothing changed.")
    else:
        done = "Approved and done" if decision == "approve" else "Rejected"
        messages.success(request, f"{done}: the {proposal.action} of {operation.key}.")
    if request.POST.get("next") == "operation":
        return redirect("operation", key=operation.key)
    return redirect("reconciliations")


@login_required
@require_POST
def reconciliation_sign(request: HttpRequest, request_id: int) -> HttpResponse:
    """What the browser needs to sign approving or rejecting the proposal (JSON)."""
    proposal, operation = reconciliation_access(request, request_id)
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "reject"):
        return json_refusal(ErrorCode.INVALID_FIELD, "decision: approve or reject")
    held = provider_permissions(user=request.user, provider=operation.provider)
    if ProviderPermission.APPROVE_RECONCILIATIONS not in held:
        return json_refusal(ErrorCode.FORBIDDEN, "you may not decide this provider's proposals")
    if proposal.status != ReconciliationRequest.Status.PENDING:
        return json_refusal(ErrorCode.ALREADY_DECIDED, f"the request is already {proposal.status}")
    signed = statement(
        "reconciliation",
        reconciliation_subject(proposal),
        decision=decision,
        person=_actor(request).stored,
    )
    return signing_begin(request, subject=proposal.pk, signed=signed)
