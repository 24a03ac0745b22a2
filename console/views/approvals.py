"""The approver's side: the inbox of approvals a user may decide, and one approval's page."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from approvals.models import Approval
from approvals.selectors import approval_votes
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from common.statements import statement
from console.forms import ApprovalDecisionForm, InboxFilterForm
from console.selectors.approvals import (
    approval_decidable_by,
    approval_proposed_by,
    approvals_inbox,
    operations_earlier,
)
from console.views.access import approval_access, refusal_status_raise
from console.views.signing import json_refusal, signed_record, signing_begin
from identity.selectors import passkey_held
from policies.services import policy_at
from policies.summaries import action_summary
from recovery.models import Operation
from recovery.params_diff import params_rows
from recovery.permissions import ProviderPermission
from recovery.selectors.access import providers_for_user
from recovery.selectors.records import approval_needs
from recovery.services.permits import approval_decision, approval_subject

# How long the permit an approval issues may wait for its dispatch.
PERMIT_TTL_SECONDS = 300
POLL_SECONDS = 5


@login_required
@require_safe
def approvals(request: HttpRequest) -> HttpResponse:
    """The pending approvals this user may decide, oldest first, filtered by the URL.

    The list polls this view, so what arrives or is decided elsewhere shows up; htmx
    swaps only the list.
    """
    deciding = providers_for_user(
        user=request.user, permissions=(ProviderPermission.DECIDE_APPROVALS,)
    )
    providers = sorted(deciding.values_list("name", flat=True))
    form = InboxFilterForm(request.GET, providers=providers)
    form.is_valid()  # an invalid filter is dropped and shown; the rest still apply
    rows, more = approvals_inbox(user=request.user, filters=form.filters())
    context = {
        "form": form,
        "rows": rows,
        "more": more,
        "has_providers": bool(providers),
        "poll_seconds": POLL_SECONDS,
    }
    template = "console/approvals.html#results" if request.htmx else "console/approvals.html"  # type: ignore[attr-defined]
    return render(request, template, context)


@login_required
@require_safe
def approval_detail(request: HttpRequest, approval_id: uuid.UUID) -> HttpResponse:
    """Exactly what would run (in plain words, by the policy it opened under), what the
    policy asked, who has decided, and the form."""
    approval = approval_access(request, approval_id)
    operation = (
        Operation.objects.filter(key=approval.operation_key)
        .select_related("host", "provider")
        .first()
    )
    if operation is None:  # operations are never deleted: a broken row, not a page
        raise Http404("no such operation")
    votes = approval_votes(approval=approval)
    me = Actor.of("user", request.user)
    mine = next((vote for vote in votes if vote.voter == me), None)
    may_decide = approval_decidable_by(user=request.user, approval=approval)
    approving = sum(1 for vote in votes if vote.approve)
    context = {
        "approval": approval,
        "operation": operation,
        "rows": params_rows(operation.params, []),
        "summary": action_summary(
            policy_at(approval.policy_version), approval.provider, approval.action, operation.params
        ),
        "votes": votes,
        "customer_voted": any(vote.voter and vote.voter.kind == "party" for vote in votes),
        "approving": approving,
        "remaining": max(approval.required - approving, 0),
        "my_vote": mine,
        "may_decide": may_decide,
        "proposer_is_me": approval_proposed_by(user=request.user, approval=approval),
        "earlier": operations_earlier(user=request.user, operation=operation),
        "form": ApprovalDecisionForm(initial={"params_digest": operation.params_digest}),
        "has_passkey": may_decide and passkey_held(user=request.user),
    }
    return render(request, "console/approval.html", context)


@login_required
@require_POST
def approval_sign(request: HttpRequest, approval_id: uuid.UUID) -> HttpResponse:
    """What the browser needs to sign this decision with the person's passkey (JSON).

    The statement (what is decided, by whom, a nonce and the time) is made here and kept
    until the signed answer comes back with the decision (``console.views.signing``).
    """
    approval = approval_access(request, approval_id)
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "deny"):
        return json_refusal(ErrorCode.INVALID_FIELD, "decision: approve or deny")
    if not approval_decidable_by(user=request.user, approval=approval):
        return json_refusal(ErrorCode.FORBIDDEN, "you may not decide this approval")
    signed = statement(
        "approval",
        approval_subject(approval),
        decision=decision,
        person=Actor.of("user", request.user).stored,
    )
    return signing_begin(request, subject=approval.pk, signed=signed)


def _outcome(approval: Approval, approve: bool, issued: bool) -> str:
    """What the decision did, for the page it redirects to."""
    if not approve:
        return "Denied: the operation will not run."
    if issued:
        return (
            f"Approved: a permit is issued for {PERMIT_TTL_SECONDS // 60} min; "
            "the host may now run the action."
        )
    # A vote that does not complete the quorum: the approval still waits.
    so_far = approval_needs(approval=approval)["approvals"]
    return (
        f"Your approval is recorded ({so_far} of {approval.required}): "
        f"it waits for {max(approval.required - so_far, 0)} more."
    )


@login_required
@require_POST
def approval_decide_view(request: HttpRequest, approval_id: uuid.UUID) -> HttpResponse:
    """Approve or deny the exact action the page showed (its digest), with a reason."""
    # One who may only view gets 403 however the form was filled.
    approval = approval_access(request, approval_id, permission=ProviderPermission.DECIDE_APPROVALS)
    form = ApprovalDecisionForm(request.POST)
    if not form.is_valid():
        if "reason" in form.errors:
            messages.error(request, "Nothing was decided: give a reason to deny.")
        else:
            messages.error(request, "Nothing was decided: the form was incomplete; try again.")
        return redirect("approval", approval_id=approval.pk)
    approve = form.cleaned_data["decision"] == "approve"
    try:
        signature = signed_record(
            request,
            kind="approval",
            subject=approval.pk,
            decision=form.cleaned_data["decision"],
            operation_key=approval.operation_key,
        )
        decided, permit = approval_decision(
            approval_id=approval.pk,
            approve=approve,
            ttl_seconds=PERMIT_TTL_SECONDS,
            decided_by=Actor.of("user", request.user),
            reviewed_digest=form.cleaned_data["params_digest"],
            reason=form.cleaned_data["reason"],
            signature=signature,
        )
    except SettleError as exc:  # the service's refusal, or the signature's (passkey_signing)
        refusal_status_raise(exc)
        # A decision after its time closes the approval (as the sweep would have).
        after = (
            "It is closed as expired."
            if exc.code == ErrorCode.APPROVAL_EXPIRED
            else "Nothing changed."
        )
        messages.error(request, f"Refused ({exc.code.value}): {exc.message}. {after}")
    else:
        messages.success(request, _outcome(decided, approve, permit is not None))
    return redirect("approval", approval_id=approval.pk)
