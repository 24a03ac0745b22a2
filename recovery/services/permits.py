"""Approvals and permits as they move an operation: open, decide, revoke."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any, NoReturn

from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, Approver, Permit
from approvals.selectors import proposer_user_for
from approvals.services.approvals import (
    NeedsVotes,
    PermitWrite,
    approval_expired,
    approval_request,
    approval_resolve,
    approval_ride,
    approval_vote,
    approval_write,
    permit_ride,
)
from approvals.services.approvers import approver_for
from approvals.services.errors import ApprovalError
from approvals.services.permits import permit_mark_revoked
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common import statements
from common.actors import Actor
from common.errors import ErrorCode
from policies.services import Terms, approval_terms, budgets_paid_last
from recovery.changes import APPROVAL_OPENED, OperationChange, changes_record
from recovery.models import Host, Operation, State
from recovery.permissions import ProviderPermission
from recovery.services.access import provider_permission_require
from recovery.services.approval_expiry import approval_expire_at_decision
from recovery.services.customers import (
    PartyNamed,
    approval_opened_data,
    party_contact_check,
    party_decision_data,
    party_decision_require,
    party_link_publish,
    party_row,
    party_vote_record,
)
from recovery.services.errors import Forbidden, NotFound, RecoveryError
from recovery.services.locking import OperationRef, binding, operation_lock, operation_lock_bound
from recovery.services.refusals import DecisionRefusal, RefusalsCommitted, refusals_recorded
from recovery.services.voters import customer_voter_check, staff_voter_check
from recovery.transitions import Event, operation_transition


def approver_scope(
    *, actor: Actor, approver: Approver | None, missing: ErrorCode
) -> Approver | None:
    """The approver whose scope bounds ``actor``: the credential given, or the one it names.

    A caller that passes no credential row does not lift an approver's scope: it is
    read from the actor (``NotFound(missing)`` if the credential is gone or disabled). A
    row that is not the actor's own is refused. None for any other kind of actor.
    """
    if approver is not None:
        if Actor.of("approver", approver) != actor:
            raise Forbidden("the approver credential given is not the one acting")
        return approver
    if actor.kind != "approver":
        return None
    found = approver_for(actor=actor)
    if found is None:
        raise NotFound(missing, f"no such {missing.value.removeprefix('unknown_')}")
    return found


# What an opening runs before its transaction ends (``approval_open``'s ``then``).
Then = Callable[[Operation, Approval, Permit | None], object]


def approval_open(
    *,
    operation: Operation | OperationRef,
    host: Host,
    proposer: str = "",
    then: Then | None = None,
    party: PartyNamed | None = None,
) -> tuple[Approval, bool]:
    """Ask for a decision on the operation's exact action (or return the pending one).

    The policy in force (``policies``) says what the new approval needs; where it
    approves or denies by itself, Settle decides it here, in the same transaction,
    naming the rule. ``proposer``: the username of the person the host acts for
    (case-insensitive), who never decides it; the user it names now is kept by id
    (``approvals.selectors``' ``proposer``). ``party``: the customer the host acts for
    (``recovery.services.customers``); where the policy asks the customer and none is
    named, nothing is written (``party_required``). ``then``: called with the locked
    operation, the new approval and the permit its policy issued, not written yet (None
    if none), before the transaction ends (``DispatchAsked``, which consumes it as it is
    written), afresh if it runs again (``policies.budgets_paid_last``); a permit it left
    rides with the events."""

    @audit_transaction()
    def opened() -> tuple[Approval, bool]:
        return approval_open_locked(
            operation_lock(operation), host=host, proposer=proposer, then=then, party=party
        )

    return budgets_paid_last(opened)


def approval_open_locked(
    operation: Operation,
    *,
    host: Host,
    proposer: str = "",
    then: Then | None = None,
    party: PartyNamed | None = None,
    registered: bool = False,
) -> tuple[Approval, bool]:
    """``approval_open`` in a transaction holding ``operation`` (``registered``: by it)."""
    party_contact_check(party)
    if operation.state != State.AWAITING_APPROVAL:
        raise RecoveryError(
            ErrorCode.INVALID_STATE,
            f"operation is {operation.state}; no approval can be opened",
            state=operation.state,
        )
    bound = binding(operation)
    asked: list[Terms] = []

    def terms(approval_id: uuid.UUID) -> dict[str, Any]:
        found = approval_terms(
            provider=bound.provider,
            action=bound.action,
            host=host.name,
            params=operation.params,
            approval_id=approval_id,
        )
        asked.append(found)
        if found.customer and party is None:
            raise RecoveryError(
                ErrorCode.PARTY_REQUIRED,
                f"policy rule {found.rule.name} asks the customer to decide: name the party",
                rule=found.rule.name,
            )
        fields = _approval_fields(found, proposer)
        if party is not None:
            fields["party"] = party_row(host=host.name, named=party)
        return fields

    requested_by = Actor.of("host", host)
    approval, created = approval_request(
        binding=bound,
        requested_by=requested_by,
        host=host.name,
        terms=terms,
        registered=registered,
        # A new operation's approval: nothing else can read it before the transaction ends.
        write="held" if registered else "now",
    )
    if not created:
        return approval, False
    (found,) = asked
    audit_append(
        kind=AuditKind.APPROVAL_REQUESTED,
        operation=operation,
        actor=requested_by,
        data={
            "approval_id": str(approval.id),
            **({"party": str(approval.party)} if approval.party is not None else {}),
            **_policy_record(found, approval),
        },
    )
    if approval.customer and approval.party is not None:
        changes_record(
            [
                OperationChange(
                    operation, APPROVAL_OPENED, operation.state, approval_opened_data(approval)
                )
            ]
        )
        if approval.party.contact:
            transaction.on_commit(partial(party_link_publish, approval.id))
    permit = None
    if found.outcome in ("approve", "deny"):
        approval_write(approval)  # the decision's compare-and-set reads it
        approval, permit = _decide(
            operation,
            approval.id,
            found.outcome == "approve",
            int(found.rule.permit_ttl.total_seconds()),
            POLICY,
            f"policy rule {found.rule.name}",
            True,
            permit_write="held",
        )
    if then is not None:
        then(operation, approval, permit)  # in this transaction, the operation still locked
    if permit is not None:
        permit_ride(permit)  # unless ``then`` consumed it (``DispatchAsked``)
    approval_ride(approval)  # a held approval nothing decided: nothing here reads it again
    return approval, True


POLICY = Actor.system("policy")


def _approval_fields(terms: Terms, proposer: str) -> dict[str, Any]:
    """An approval's policy fields, from what the policy asked of it."""
    now = timezone.now()
    rule = terms.rule

    def after(delay: timedelta | None) -> Any:
        return now + delay if delay is not None else None

    return {
        "rule": rule.name,
        "rule_reason": rule.reason,
        "policy_version": terms.version,
        # The customer's vote, and the staff's beside it for customer_and_staff.
        "required": 2 if terms.customer == "customer_and_staff" else rule.approvals,
        "groups": list(rule.groups),
        "passkey_required": terms.passkey,
        "proposer": proposer,
        "proposer_user": proposer_user_for(name=proposer),
        "voting": bool(
            rule.approvals > 1 or rule.groups or terms.passkey or proposer or terms.customer
        ),
        "customer": terms.customer,
        "customer_passkey": terms.customer_passkey,
        "expires_at": after(rule.expires_after),
        "notify_groups": list(rule.notify),
        "escalate_groups": list(rule.escalate_to),
        "remind_at": after(rule.remind_after),
        "escalate_at": after(rule.escalate_after),
    }


def _policy_record(terms: Terms, approval: Approval) -> dict[str, Any]:
    """What the audit log says of the policy's part in an opening (nothing without one)."""
    if not terms.version:
        return {}
    record: dict[str, Any] = {
        "policy_version": terms.version,
        "rule": terms.rule.name,
        "outcome": terms.outcome,
        "required": approval.required,
    }
    if terms.customer:
        record["customer"] = terms.customer
        record["customer_passkey"] = terms.customer_passkey
    if terms.budget is not None:
        record["budget"] = terms.budget
    return record


@refusals_recorded(actor="decided_by")
def approval_decision(
    *,
    approval_id: uuid.UUID,
    approve: bool,
    ttl_seconds: int,
    decided_by: Actor,
    reviewed_digest: str,
    approver: Approver | None = None,
    reason: str = "",
    signature: dict[str, Any] | None = None,
) -> tuple[Approval, Permit | None]:
    """Record a decision on exactly the action the approver reviewed; move the operation.

    ``reviewed_digest``: the params digest the approver saw. Another digest decides
    nothing; the refusal is recorded and raised once recorded.

    Who decides: an approver within its scope (``approver_scope``: outside it an
    approval does not exist for it); a console user holding
    ``decide_approvals`` on the provider (``forbidden`` for one who may only view it;
    to anyone else the approval does not exist); the party an approval is addressed to
    (``Actor.party``; to any other party it does not exist); Settle itself. Never a host.

    A person's (or an approver's) decision is a vote: the approval is approved once
    ``required`` distinct voters approved it, and denied by the first denial. The
    proposer never votes, nor anyone outside the approval's ``groups``; where the
    policy requires a passkey, only a signed vote (``signature``, verified by the
    caller against the person's registered passkey) counts. An approval addressed to the
    customer (``Approval.customer``) counts the party's vote, and for
    ``customer_and_staff`` one staff vote beside it; neither stands in for the other
    (``customer_required``), and where ``customer_passkey`` only a signed party vote counts.
    """
    if decided_by.kind not in ("approver", "user", "system", "party"):
        raise Forbidden(f"a {decided_by.kind} may not decide approvals")
    approver = approver_scope(
        actor=decided_by, approver=approver, missing=ErrorCode.UNKNOWN_APPROVAL
    )
    with RefusalsCommitted():
        operation = operation_lock_bound(
            Approval, approval_id, missing=ErrorCode.UNKNOWN_APPROVAL, approver=approver
        )
        if decided_by.kind == "user":
            provider_permission_require(
                actor=decided_by,
                provider=operation.provider,
                permission=ProviderPermission.DECIDE_APPROVALS,
                action="approve or deny",
                visible=(ProviderPermission.VIEW_OPERATIONS, ProviderPermission.DECIDE_APPROVALS),
                missing=ErrorCode.UNKNOWN_APPROVAL,
            )
        if decided_by.kind == "party":
            party_decision_require(approval_id=approval_id, party=decided_by)
        refuse = DecisionRefusal(operation, approval_id, decided_by)
        if reviewed_digest != operation.params_digest:
            refuse(
                ErrorCode.DIGEST_MISMATCH,
                "the approval is for other parameters than the ones reviewed",
                {"reviewed_digest": reviewed_digest},
                params_digest=operation.params_digest,
            )
        # Decided here, nothing after in this transaction reads the permit: it rides.
        decision = (operation, approval_id, approve, ttl_seconds, decided_by)
        if decided_by.kind == "system":
            return _decide(*decision, reason, True, refuse, permit_write="riding")
        # A customer approval is decided by votes alone (a party's is recorded as one).
        if not signature and decided_by.kind != "party":
            try:
                return _decide(*decision, reason, refuse=refuse, permit_write="riding")
            except NeedsVotes:
                pass
        approval = Approval.objects.get(pk=approval_id)
        if approval.status != Approval.Status.PENDING and decided_by.kind == "party":
            refuse(
                ErrorCode.APPROVAL_EXPIRED
                if approval.status == Approval.Status.EXPIRED
                else ErrorCode.ALREADY_DECIDED,
                f"approval is already {approval.status}",
                {"status": approval.status},
                status=approval.status,
            )
        if approval.status != Approval.Status.PENDING:
            raise RecoveryError(
                ErrorCode.ALREADY_DECIDED,
                f"approval is already {approval.status}",
                status=approval.status,
            )
        # Before any vote is recorded: past its time, nobody's decision counts.
        if approval_expired(approval=approval):
            _expired_refuse(operation, approval_id, refuse)
        # The caller checked the signature; here, that what it signs is this very decision.
        if signature and not statements.statement_matches(
            signature,
            "approval",
            decision="approve" if approve else "deny",
            person=decided_by.stored,
            **approval_subject(approval),
        ):
            refuse(ErrorCode.SIGNATURE_INVALID, "the signed statement is not this decision", {})
        if approval.customer:
            customer_voter_check(approval, decided_by, signature, refuse)
        if decided_by.kind != "party":
            staff_voter_check(approval, decided_by, signature, refuse)
        try:
            vote, approvals_so_far = approval_vote(
                approval=approval,
                voter=decided_by,
                approve=approve,
                reason=reason,
                signature=signature,
            )
        except ApprovalError as exc:
            if decided_by.kind == "party" and exc.code == ErrorCode.ALREADY_VOTED:
                # Two tabs or two taps: to the customer, their decision is made.
                refuse(ErrorCode.ALREADY_DECIDED, "you have decided this approval already", {})
            refuse(exc.code, exc.message, {})
        audit_append(
            kind=AuditKind.APPROVAL_VOTED,
            operation=operation,
            actor=decided_by,
            data={
                "approval_id": str(approval.id),
                "decision": "approve" if approve else "deny",
                "reason": reason,
                "params_digest": approval.params_digest,
                "approvals": approvals_so_far,
                "required": approval.required,
                **({"signature": vote.signature} if vote.signature else {}),
                **party_vote_record(decided_by, signature),
            },
        )
        if approve and approvals_so_far < approval.required:
            return approval, None
        return _decide(*decision, reason, True, refuse, permit_write="riding")


def _expired_refuse(
    operation: Operation, approval_id: uuid.UUID, refuse: DecisionRefusal
) -> NoReturn:
    """Refuse a decision that came after the approval's ``expires_at``, and expire it now,
    as the sweep would (``approval_expiry``): the refusal and the expiry commit together
    (``RefusalsCommitted``), whatever the sweep's lag."""
    approval_expire_at_decision(operation=operation, approval_id=approval_id)
    refuse(ErrorCode.APPROVAL_EXPIRED, ErrorCode.APPROVAL_EXPIRED.message, {})


def approval_subject(approval: Approval) -> dict[str, object]:
    """What a signed decision on ``approval`` names (``common.statements.approval_subject``)."""
    return statements.approval_subject(
        approval_id=approval.pk,
        operation_key=approval.operation_key,
        params_digest=approval.params_digest,
    )


def _decide(
    operation: Operation,
    approval_id: uuid.UUID,
    approve: bool,
    ttl_seconds: int,
    actor: Actor,
    reason: str = "",
    counted: bool = False,
    refuse: DecisionRefusal | None = None,
    permit_write: PermitWrite = "now",
) -> tuple[Approval, Permit | None]:
    """Decide the approval and move the operation; ``refuse``: how a person's decision
    that came after the approval's ``expires_at`` is refused and recorded;
    ``permit_write``: as ``approval_resolve``'s."""
    try:
        approval, permit = approval_resolve(
            approval_id=approval_id,
            binding=binding(operation),
            approve=approve,
            decided_by=actor,
            ttl_seconds=ttl_seconds,
            reason=reason,
            counted=counted,
            permit_write=permit_write,
        )
    except ApprovalError as exc:
        if exc.code == ErrorCode.APPROVAL_EXPIRED and refuse is not None:
            _expired_refuse(operation, approval_id, refuse)
        current = Approval.objects.filter(pk=approval_id).values_list("status", flat=True)
        raise RecoveryError(exc.code, exc.message, status=current.first()) from exc
    if permit is not None:
        audit_append(
            kind=AuditKind.PERMIT_ISSUED,
            operation=operation,
            actor=actor,
            data={
                "permit_id": str(permit.id),
                "params_digest": permit.params_digest,
                "expires_at": permit.expires_at.isoformat(),
            },
        )
    # Nothing after a decision reads the operation's row: its move rides with the events.
    operation_transition(
        operation=operation,
        event=Event.APPROVE if approve else Event.DENY,
        actor=actor,
        riding=True,
        data={
            "approval_id": str(approval.id),
            **({"reason": reason} if reason else {}),
            **party_decision_data(approval),
        },
    )
    return approval, permit


@refusals_recorded()
@audit_transaction()
def permit_revoke(
    *,
    permit_id: uuid.UUID,
    reason: str,
    actor: Actor,
    host: Host | None = None,
    approver: Approver | None = None,
) -> tuple[Permit, bool]:
    """Revoke a permit; an approved operation that can no longer dispatch is closed.

    ``host``, ``approver``: the permit must be for one of this host's operations, or
    within this approver's scope (else it does not exist for them); an approver acting
    is bounded by its scope whether or not its row is given.
    """
    approver = approver_scope(actor=actor, approver=approver, missing=ErrorCode.UNKNOWN_PERMIT)
    operation = operation_lock_bound(
        Permit, permit_id, missing=ErrorCode.UNKNOWN_PERMIT, host=host, approver=approver
    )
    permit = Permit.objects.select_for_update().get(pk=permit_id)
    revoked = permit_mark_revoked(permit=permit, reason=reason, actor=actor)
    audit_append(
        kind=AuditKind.PERMIT_REVOKED if revoked else AuditKind.PERMIT_REVOKE_IGNORED,
        operation=operation,
        actor=actor,
        data={"permit_id": str(permit.id), "reason": reason, "permit_status": permit.status},
    )
    if revoked and operation.state == State.APPROVED:
        operation_transition(operation=operation, event=Event.REVOKE, actor=actor)
    return permit, revoked
