"""Reconciliation: an operator confirms, voids, or repairs a stranded receipt — four eyes
where the evidence does not back the decision.

decision
    ``confirm`` (the effect happened: ``released``), ``void`` (it did not: ``voided``),
    ``repair`` (complete the stranded receipt of a settled operation: ``succeeded`` for
    a released one, ``failed`` for a failed or voided one). Confirm and void are
    transitions of the one table; a repair changes the receipt only.
backed
    The latest evidence supports the decision by itself: confirm and repair-as-succeeded
    on a ``match`` of a committed record; void and repair-as-failed on a provider's
    ``failed`` record, or on ``absent`` from a provider whose absence was authoritative
    when the evidence was captured (``Evidence.absent_is_authoritative``). A backed
    decision is taken at once by anyone holding its permission (``DECISION_PERMISSIONS``).
four eyes
    An unbacked decision becomes a ``ReconciliationRequest`` (``propose_reconciliations``)
    that a different user holding ``approve_reconciliations`` approves or rejects. It is
    bound to the operation's version and latest evidence as the proposer saw them: if
    either moved on, approving it invalidates it instead. Approving and the change it
    approves are one transaction.
refused outright
    Voiding an operation whose latest evidence matches a committed record: the provider
    says it happened.

Every decision, proposal and refusal is an audit event on the operation's chain; the
recovery receipt a decision produces points at the evidence or the request behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from approvals.actors import Actor
from approvals.models import ReconciliationRequest
from audit.chain import audit_append, audit_chain_locked, audit_transaction
from audit.kinds import AuditKind
from common.errors import ErrorCode
from dbsql.writes import update
from recovery.models import Dispatch, Evidence, Operation, State, Verdict
from recovery.permissions import ProviderPermission
from recovery.services.access import provider_permission_require
from recovery.services.claims import claims_check_many
from recovery.services.errors import NotFound, RecoveryError
from recovery.services.evidence import receipt_complete, receipt_grounds
from recovery.services.locking import locking, operation_lock
from recovery.services.operator import (
    operator_locked,
    operator_permitted,
    operator_refusals,
    version_check,
)
from recovery.services.stale_signals import refusals_recorded
from recovery.transitions import (
    Change,
    Event,
    next_state,
    operation_transition,
    operation_transition_many,
)

Action = ReconciliationRequest.Action

# Each decision's own permission; what the evidence does not back also needs
# ``propose_reconciliations``, and a second user's ``approve_reconciliations``.
DECISION_PERMISSIONS: dict[str, ProviderPermission] = {
    Action.CONFIRM: ProviderPermission.CONFIRM_OPERATIONS,
    Action.VOID: ProviderPermission.VOID_OPERATIONS,
    Action.REPAIR: ProviderPermission.REPAIR_OPERATIONS,
}

# What each decision does to a stranded receipt: completed as succeeded, or as failed.
_SETTLED_SUCCEEDED = {State.RELEASED}
_SETTLED_FAILED = {State.FAILED, State.VOIDED}


def evidence_latest(operation: Operation) -> Evidence | None:
    return operation.evidence.order_by("-captured_at", "-id").first()


def _committed(evidence: Evidence | None) -> bool:
    return (
        evidence is not None
        and evidence.verdict == Verdict.MATCH
        and evidence.provider_status == "committed"
    )


def _not_performed(evidence: Evidence | None) -> bool:
    if evidence is None:
        return False
    if evidence.verdict == Verdict.MATCH:
        return evidence.provider_status == "failed"
    # As the provider was configured when the record was read: turning the flag on later
    # does not make earlier absences authoritative.
    return evidence.verdict == Verdict.ABSENT and evidence.absent_is_authoritative


def _stranded(dispatch: Dispatch | None) -> bool:
    return dispatch is not None and dispatch.receipt_status == Dispatch.ReceiptStatus.RUNNING


def reconcile_grounds(
    *, operation: Operation, action: str, evidence: Evidence | None, dispatch: Dispatch | None
) -> Evidence | None:
    """The evidence that backs ``action`` on ``operation`` as it is now, or None when only
    four eyes can; ``RecoveryError`` if it may not be taken at all.

    Pure: reads nothing, so that the page can show the same answer the service gives.
    """
    if action == Action.REPAIR:
        if not _stranded(dispatch) or operation.state not in _SETTLED_SUCCEEDED | _SETTLED_FAILED:
            raise RecoveryError(
                ErrorCode.NOT_STRANDED,
                "only the running receipt of a settled operation can be repaired "
                f"(the operation is {operation.state})",
            )
        if operation.state in _SETTLED_SUCCEEDED:
            backed = _committed(evidence)
        else:
            backed = _not_performed(evidence)
        return evidence if backed else None
    event = Event.CONFIRM if action == Action.CONFIRM else Event.VOID
    if action not in (Action.CONFIRM, Action.VOID):
        raise RecoveryError(ErrorCode.UNKNOWN_ACTION, f"no operator decision {action!r}")
    if next_state(operation.state, event) is None:
        raise RecoveryError(
            ErrorCode.NOT_ALLOWED, f"an operation in {operation.state} cannot be {event}ed"
        )
    if action == Action.CONFIRM:
        return evidence if _committed(evidence) else None
    if _committed(evidence):
        raise RecoveryError(
            ErrorCode.EVIDENCE_MATCHES,
            "the provider's record matches a committed effect: it happened, so it cannot be voided",
        )
    return evidence if _not_performed(evidence) else None


@dataclass(frozen=True)
class Decided:
    """What an operator's decision came to: done now, or proposed for four eyes."""

    operation: Operation
    action: str
    request: ReconciliationRequest | None = None  # set when it waits for a second operator

    @property
    def proposed(self) -> bool:
        return (
            self.request is not None and self.request.status == ReconciliationRequest.Status.PENDING
        )


def _apply(
    operation: Operation,
    action: str,
    actor: Actor,
    reason: str,
    *,
    evidence: Evidence | None = None,
    request: ReconciliationRequest | None = None,
) -> None:
    """Take the decision: the transition (confirm, void) and the stranded receipt, if any."""
    grounds = receipt_grounds(evidence, request)
    if action in (Action.CONFIRM, Action.VOID):
        operation_transition(
            operation=operation,
            event=Event.CONFIRM if action == Action.CONFIRM else Event.VOID,
            actor=actor,
            data={"reason": reason, **grounds},
            next_lookup_at=None,
            receipt_running=False,  # completed below if it is still running
        )
    dispatch = Dispatch.of(operation)
    if _stranded(dispatch):
        assert dispatch is not None
        if action == Action.REPAIR:  # no transition to say the receipt is complete
            update(Operation, where={"pk": operation.pk}, values={"receipt_running": False})
        receipt_complete(
            operation=operation,
            dispatch=dispatch,
            succeeded=operation.state in _SETTLED_SUCCEEDED,
            actor=actor,
            evidence=evidence,
            request=request,
        )


@refusals_recorded()
def operation_reconcile(
    *,
    operation: Operation,
    action: str,
    version: int,
    reason: str,
    actor: Actor,
    propose: bool = True,
) -> Decided:
    """Confirm, void or repair now if the evidence backs it; otherwise propose it.

    Refused without the action's own permission (``DECISION_PERMISSIONS``); what the
    evidence does not back is proposed only by an actor who also holds
    ``propose_reconciliations`` (else ``four_eyes_required``), and never when
    ``propose`` is off (``not_backed``: a bulk confirm takes only what the evidence backs).
    """
    permission = DECISION_PERMISSIONS.get(action)
    if permission is None:
        raise RecoveryError(ErrorCode.UNKNOWN_ACTION, f"no operator decision {action!r}")
    held = operator_permitted(
        operation=operation, action=action, permission=permission, actor=actor
    )
    may_propose = ProviderPermission.PROPOSE_RECONCILIATIONS in held
    with operator_refusals(operation, action, actor):
        locked = operator_locked(operation=operation, version=version, actor=actor)
        return _decide(locked, action, version, reason, actor, may_propose, propose)


def _decide(
    locked: Operation,
    action: str,
    version: int,
    reason: str,
    actor: Actor,
    may_propose: bool,
    propose: bool = True,
) -> Decided:
    evidence = evidence_latest(locked)
    dispatch = Dispatch.of(locked)
    backing = reconcile_grounds(
        operation=locked, action=action, evidence=evidence, dispatch=dispatch
    )
    if backing is not None:
        audit_append(
            kind=AuditKind.OPERATOR_ACTION,
            operation=locked,
            actor=actor,
            data={
                "action": action,
                "reason": reason,
                "version": version,
                "evidence_id": backing.pk,
            },
        )
        _apply(locked, action, actor, reason, evidence=backing)
        return Decided(locked, action)
    if not propose:
        raise _not_backed(action, evidence)
    if not may_propose:
        raise RecoveryError(
            ErrorCode.FOUR_EYES_REQUIRED,
            f"the evidence does not back a {action}: it needs a proposal that a second "
            "operator approves, and you may not propose one",
        )
    pending = ReconciliationRequest.objects.filter(
        operation_key=locked.key, status=ReconciliationRequest.Status.PENDING
    ).first()
    if pending is not None:
        raise RecoveryError(
            ErrorCode.REQUEST_PENDING,
            f"a proposed {pending.action} already waits for approval",
            request_id=pending.pk,
        )
    request = ReconciliationRequest.objects.create(
        operation_key=locked.key,
        provider=locked.provider.name,
        params_digest=locked.params_digest,
        action=action,
        operation_version=locked.version,
        evidence_seen=evidence.pk if evidence is not None else None,
        reason=reason,
        proposed_by=actor,
        proposed_at=timezone.now(),
    )
    audit_append(
        kind=AuditKind.RECONCILIATION_PROPOSED,
        operation=locked,
        actor=actor,
        data={
            "request_id": request.pk,
            "action": action,
            "reason": reason,
            "version": version,
            "evidence_id": request.evidence_seen,
        },
    )
    return Decided(locked, action, request)


def _not_backed(action: str, evidence: Evidence | None) -> RecoveryError:
    verdict = evidence.verdict if evidence is not None else "none"
    return RecoveryError(
        ErrorCode.NOT_BACKED,
        f"the latest evidence does not back a {action} (latest verdict: {verdict})",
    )


def operations_confirm_many(
    *, picks: list[tuple[Operation, int]], reason: str, actor: Actor
) -> dict[int, Decided | RecoveryError]:
    """``operation_reconcile(action="confirm", propose=False)`` for many operations at
    once, in the caller's ``audit_transaction``: each one's outcome, by operation id.

    The same rules, read and written set-wise (a bulk confirm of thousands): the
    permission per provider (``provider_permission_require``), the version each was
    picked at (``version_check``), claims (``claims_check_many``), what the evidence
    backs (``reconcile_grounds``), the transitions (``operation_transition_many``) and
    the stranded receipts (as ``_apply``). Each operation is refused on its own, with
    what the single call raises; a refusal is recorded on the chain (``operator_refused``)
    of an operation ``actor`` may see. The operations are locked in id order; each at
    most once.
    """
    outcomes: dict[int, Decided | RecoveryError] = {}
    versions = {operation.pk: version for operation, version in picks}
    checked: dict[int, RecoveryError | None] = {}
    for operation, _ in picks:
        if operation.provider_id not in checked:
            try:
                provider_permission_require(
                    actor=actor,
                    provider=operation.provider,
                    permission=DECISION_PERMISSIONS[Action.CONFIRM],
                    action=Action.CONFIRM,
                )
                checked[operation.provider_id] = None
            except RecoveryError as refused_here:
                checked[operation.provider_id] = refused_here
        hidden = checked[operation.provider_id]
        if isinstance(hidden, NotFound):  # not theirs to see: neither locked nor recorded
            outcomes[operation.pk] = hidden
    rows = locking(Operation.objects.filter(pk__in=[pk for pk in versions if pk not in outcomes]))
    locked = {operation.pk: audit_chain_locked(operation) for operation in rows.order_by("pk")}
    for pk in versions.keys() - locked.keys() - outcomes.keys():
        outcomes[pk] = NotFound(ErrorCode.UNKNOWN_OPERATION, "no such operation")
    permitted = [op for op in locked.values() if checked[op.provider_id] is None]
    claimed = claims_check_many(permitted, actor)
    latest = _evidence_latest_many(list(locked))
    dispatches = {d.operation_id: d for d in Dispatch.objects.filter(operation_id__in=list(locked))}
    changes = []
    backing_of: dict[int, Evidence] = {}
    for pk, operation in locked.items():
        try:
            forbidden = checked[operation.provider_id]
            if forbidden is not None:
                raise forbidden
            version_check(operation, versions[pk])
            if pk in claimed:
                raise claimed[pk]
            backing = reconcile_grounds(
                operation=operation,
                action=Action.CONFIRM,
                evidence=latest.get(pk),
                dispatch=dispatches.get(pk),
            )
            if backing is None:
                raise _not_backed(Action.CONFIRM, latest.get(pk))
        except RecoveryError as refusal:
            outcomes[pk] = refusal
            operator_refusals(operation, Action.CONFIRM, actor).append(refusal)
            continue
        audit_append(
            kind=AuditKind.OPERATOR_ACTION,
            operation=operation,
            actor=actor,
            data={
                "action": Action.CONFIRM,
                "reason": reason,
                "version": versions[pk],
                "evidence_id": backing.pk,
            },
        )
        backing_of[pk] = backing
        changes.append(
            Change(
                operation,
                Event.CONFIRM,
                data={"reason": reason, **receipt_grounds(backing, None)},
                fields={"next_lookup_at": None, "receipt_running": False},  # as _apply
            )
        )
    refused = operation_transition_many(changes=changes, actor=actor)
    if refused:  # each is locked and its version checked: nothing can have moved it
        raise refused[0]
    for pk, backing in backing_of.items():
        operation, dispatch = locked[pk], dispatches.get(pk)
        if _stranded(dispatch):
            assert dispatch is not None
            receipt_complete(
                operation=operation,
                dispatch=dispatch,
                succeeded=True,
                actor=actor,
                evidence=backing,
            )
        outcomes[pk] = Decided(operation, Action.CONFIRM)
    return outcomes


def _evidence_latest_many(operation_ids: list[int]) -> dict[int, Evidence]:
    """``evidence_latest`` of each operation, in one read (an operation has a few)."""
    latest: dict[int, Evidence] = {}
    rows = (
        Evidence.objects.filter(operation_id__in=operation_ids)
        .defer("raw")
        .order_by("operation_id", "-captured_at", "-id")
    )
    for evidence in rows:
        latest.setdefault(evidence.operation_id, evidence)
    return latest


def _request_locked(
    operation: Operation, request_id: int
) -> tuple[Operation, ReconciliationRequest]:
    """The operation, then its request (the lock order: operation, then approvals rows)."""
    locked = operation_lock(operation)
    request = ReconciliationRequest.objects.select_for_update().get(
        pk=request_id, operation_key=locked.key
    )
    return locked, request


def _request_closed(request: ReconciliationRequest, status: str, actor: Actor, reason: str) -> None:
    request.status = status
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason[:500]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])


def _changed_since(locked: Operation, request: ReconciliationRequest) -> str | None:
    """What moved on since the request was proposed, or None."""
    if locked.version != request.operation_version:
        return (
            f"the operation moved on: it is now {locked.state}, version {locked.version} "
            f"(proposed at version {request.operation_version})"
        )
    latest = evidence_latest(locked)
    if (latest.pk if latest is not None else None) != request.evidence_seen:
        verdict = latest.verdict if latest is not None else "none"
        return f"new evidence arrived since it was proposed (latest verdict: {verdict})"
    return None


def _still_holds(
    locked: Operation, request: ReconciliationRequest
) -> tuple[Evidence | None, str | None]:
    """The evidence backing the proposal now (if any), or what moved on since it was made."""
    changed = _changed_since(locked, request)
    if changed is not None:
        return None, changed
    try:
        backing = reconcile_grounds(
            operation=locked,
            action=request.action,
            evidence=evidence_latest(locked),
            dispatch=Dispatch.of(locked),
        )
    except RecoveryError as exc:
        return None, exc.message
    return backing, None


@refusals_recorded()
def reconciliation_approve(
    *, operation: Operation, request_id: int, reason: str, actor: Actor
) -> Decided:
    """Approve another operator's proposal and take the decision, in one transaction.

    Refused without ``approve_reconciliations``, for the proposer (``self_approval``)
    and for a request already decided; a request whose operation or evidence moved on
    since the proposal is invalidated (``request_invalidated``).
    """
    operator_permitted(
        operation=operation,
        action="approve",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with operator_refusals(operation, "approve", actor):
        locked, request = _request_locked(operation, request_id)
        if request.status != ReconciliationRequest.Status.PENDING:
            raise RecoveryError(
                ErrorCode.ALREADY_DECIDED, f"the request is already {request.status}"
            )
        if request.proposed_by == actor:
            raise RecoveryError(
                ErrorCode.SELF_APPROVAL, "a proposal needs a second operator: you proposed this one"
            )
        backing, changed = _still_holds(locked, request)
        if changed is not None:
            _request_closed(request, ReconciliationRequest.Status.INVALIDATED, actor, changed)
            audit_append(
                kind=AuditKind.RECONCILIATION_INVALIDATED,
                operation=locked,
                actor=actor,
                data={"request_id": request.pk, "action": request.action, "why": changed},
            )
            raise RecoveryError(ErrorCode.REQUEST_INVALIDATED, f"nothing was done: {changed}")
        _request_closed(request, ReconciliationRequest.Status.APPROVED, actor, reason)
        audit_append(
            kind=AuditKind.RECONCILIATION_APPROVED,
            operation=locked,
            actor=actor,
            data={
                "request_id": request.pk,
                "action": request.action,
                "reason": reason,
                "proposed_by": str(request.proposed_by),
            },
        )
        _apply(
            locked,
            request.action,
            actor,
            request.reason,
            evidence=backing,
            request=None if backing is not None else request,
        )
        return Decided(locked, request.action, request)


def reconciliation_reject(
    *, operation: Operation, request_id: int, reason: str, actor: Actor
) -> ReconciliationRequest:
    """Reject a pending proposal; nothing else changes.

    Needs ``approve_reconciliations``: a proposer withdraws their own this way only if
    they may also approve proposals.
    """
    operator_permitted(
        operation=operation,
        action="reject",
        permission=ProviderPermission.APPROVE_RECONCILIATIONS,
        actor=actor,
    )
    with audit_transaction():
        locked, request = _request_locked(operation, request_id)
        if request.status == ReconciliationRequest.Status.PENDING:
            _request_closed(request, ReconciliationRequest.Status.REJECTED, actor, reason)
            audit_append(
                kind=AuditKind.RECONCILIATION_REJECTED,
                operation=locked,
                actor=actor,
                data={"request_id": request.pk, "action": request.action, "reason": reason},
            )
            return request
    operator_refusals(operation, "reject", actor).refuse(
        RecoveryError(ErrorCode.ALREADY_DECIDED, f"the request is already {request.status}")
    )
