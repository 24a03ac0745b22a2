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
    that a different user holding ``approve_reconciliations`` approves or rejects
    (``recovery.services.four_eyes``).
refused outright
    Voiding an operation whose latest evidence matches a committed record: the provider
    says it happened.

Every decision, proposal and refusal is an audit event on the operation's chain; the
recovery receipt a decision produces points at the evidence or the request behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.chain import audit_append
from audit.kinds import AuditKind
from common.actors import Actor
from common.errors import ErrorCode
from dbsql.writes import update
from recovery.models import Dispatch, Evidence, Operation, State, Verdict, receipt_stranded
from recovery.permissions import ProviderPermission
from recovery.services.access import provider_permission_require
from recovery.services.claims import claims_check_many
from recovery.services.errors import NotFound, RecoveryError
from recovery.services.evidence import receipt_complete, receipt_grounds
from recovery.services.locking import operations_locked_by_id
from recovery.services.operator import OperatorRefusals, version_check
from recovery.services.refusals import RefusalsCommitted, refusals_recorded
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


def _stranded(operation: Operation, dispatch: Dispatch | None) -> bool:
    return dispatch is not None and receipt_stranded(
        state=operation.state, receipt_status=dispatch.receipt_status
    )


def reconcile_grounds(
    *, operation: Operation, action: str, evidence: Evidence | None, dispatch: Dispatch | None
) -> Evidence | None:
    """The evidence that backs ``action`` on ``operation`` as it is now, or None when only
    four eyes can; ``RecoveryError`` if it may not be taken at all.

    Pure: reads nothing, so that the page can show the same answer the service gives.
    """
    if action == Action.REPAIR:
        if (
            not _stranded(operation, dispatch)
            or operation.state not in _SETTLED_SUCCEEDED | _SETTLED_FAILED
        ):
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


def decision_route(
    *,
    operation: Operation,
    action: str,
    held: frozenset[str],
    evidence: Evidence | None,
    dispatch: Dispatch | None,
) -> Evidence | None:
    """How someone holding ``held`` takes ``action`` now: the evidence that backs it (taken
    at once), or None (proposed for four eyes); ``RecoveryError`` if they may not.

    What the evidence does not back is proposed only by someone who also holds
    ``propose_reconciliations`` (else ``four_eyes_required``). Pure, as
    ``reconcile_grounds``: the operation page offers exactly what the service will do.
    """
    backing = reconcile_grounds(
        operation=operation, action=action, evidence=evidence, dispatch=dispatch
    )
    if backing is None and ProviderPermission.PROPOSE_RECONCILIATIONS not in held:
        raise RecoveryError(
            ErrorCode.FOUR_EYES_REQUIRED,
            f"the evidence does not back a {action}: it needs a proposal that a second "
            "operator approves, and you may not propose one",
        )
    return backing


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


def apply_decision(
    operation: Operation,
    action: str,
    actor: Actor,
    reason: str,
    *,
    evidence: Evidence | None = None,
    request: ReconciliationRequest | None = None,
) -> None:
    """Take the decision: the transition (confirm, void) and the stranded receipt, if any."""
    change = _decision_change(operation, action, reason, evidence, request)
    if change is not None:
        operation_transition(
            operation=operation,
            event=change.event,
            actor=actor,
            data=change.data,
            **change.fields,
        )
    _receipt_settled(operation, Dispatch.of(operation), action, actor, evidence, request)


def _decision_change(
    operation: Operation,
    action: str,
    reason: str,
    evidence: Evidence | None,
    request: ReconciliationRequest | None,
) -> Change | None:
    """A confirm's or a void's transition, naming what backs it; a repair has none."""
    if action not in (Action.CONFIRM, Action.VOID):
        return None
    return Change(
        operation,
        Event.CONFIRM if action == Action.CONFIRM else Event.VOID,
        data={"reason": reason, **receipt_grounds(evidence, request)},
        # The receipt is completed next if it is still running.
        fields={"next_lookup_at": None, "receipt_running": False},
    )


def _receipt_settled(
    operation: Operation,
    dispatch: Dispatch | None,
    action: str,
    actor: Actor,
    evidence: Evidence | None,
    request: ReconciliationRequest | None,
) -> None:
    """Complete a stranded receipt as the decision settled the operation."""
    if not _stranded(operation, dispatch):
        return
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

    ``operations_reconcile_many`` of one operation: its refusal is recorded on the
    operation's chain, committed, then raised.
    """
    with RefusalsCommitted():
        outcome = operations_reconcile_many(
            picks=[(operation, version)],
            action=action,
            reason=reason,
            actor=actor,
            propose=propose,
        )[operation.pk]
        if isinstance(outcome, RecoveryError):
            raise outcome
    return outcome


def operations_reconcile_many(
    *,
    picks: list[tuple[Operation, int]],
    action: str,
    reason: str,
    actor: Actor,
    propose: bool = True,
) -> dict[int, Decided | RecoveryError]:
    """Confirm, void or repair each operation now if the evidence backs it, otherwise
    propose it; in the caller's ``audit_transaction``: each one's outcome, by id.

    ``picks``: each operation and the version the actor saw it at. Refused, each on its
    own: without the action's own permission on the operation's provider
    (``DECISION_PERMISSIONS``; an operation the actor may not even see is ``NotFound``
    and neither locked nor recorded), on a version it moved on from
    (``version_check``), under another's live claim (``claims_check_many``), where the
    evidence rules the action out, and where it does not back the action but the actor
    may not propose (``decision_route``) or ``propose`` is off (``not_backed``: a bulk
    confirm takes only what the evidence backs). Each refusal is recorded on the chain
    (``operator_refused``). The operations are locked in id order, each at most once; the
    transitions are one statement (``operation_transition_many``).
    """
    permission = DECISION_PERMISSIONS.get(action)
    if permission is None:
        raise RecoveryError(ErrorCode.UNKNOWN_ACTION, f"no operator decision {action!r}")
    outcomes: dict[int, Decided | RecoveryError] = {}
    versions = {operation.pk: version for operation, version in picks}
    held: dict[int, frozenset[str] | RecoveryError] = {}
    for operation, _ in picks:
        if operation.provider_id not in held:
            try:
                held[operation.provider_id] = provider_permission_require(
                    actor=actor, provider=operation.provider, permission=permission, action=action
                )
            except RecoveryError as refused_here:
                held[operation.provider_id] = refused_here
        hidden = held[operation.provider_id]
        if isinstance(hidden, NotFound):  # not theirs to see: neither locked nor recorded
            outcomes[operation.pk] = hidden
    locked = operations_locked_by_id([pk for pk in versions if pk not in outcomes])
    for pk in versions.keys() - locked.keys() - outcomes.keys():
        outcomes[pk] = NotFound(ErrorCode.UNKNOWN_OPERATION, "no such operation")
    permitted = [op for op in locked.values() if isinstance(held[op.provider_id], frozenset)]
    claimed = claims_check_many(permitted, actor)
    latest = _evidence_latest_many(list(locked))
    dispatches = {d.operation_id: d for d in Dispatch.objects.filter(operation_id__in=list(locked))}
    changes = []
    taken: dict[int, Evidence] = {}
    for pk, operation in locked.items():
        evidence, dispatch = latest.get(pk), dispatches.get(pk)
        try:
            rights = held[operation.provider_id]
            if isinstance(rights, RecoveryError):
                raise rights
            version_check(operation, versions[pk])
            if pk in claimed:
                raise claimed[pk]
            if propose:
                backing = decision_route(
                    operation=operation,
                    action=action,
                    held=rights,
                    evidence=evidence,
                    dispatch=dispatch,
                )
            else:
                backing = reconcile_grounds(
                    operation=operation, action=action, evidence=evidence, dispatch=dispatch
                )
                if backing is None:
                    raise _not_backed(action, evidence)
            if backing is None:
                request = _proposed(operation, action, versions[pk], reason, actor, evidence)
                outcomes[pk] = Decided(operation, action, request)
                continue
        except RecoveryError as refusal:
            outcomes[pk] = refusal
            OperatorRefusals(operation, action, actor).append(refusal)
            continue
        audit_append(
            kind=AuditKind.OPERATOR_ACTION,
            operation=operation,
            actor=actor,
            data={
                "action": action,
                "reason": reason,
                "version": versions[pk],
                "evidence_id": backing.pk,
            },
        )
        taken[pk] = backing
        change = _decision_change(operation, action, reason, backing, None)
        if change is not None:
            changes.append(change)
    refused = operation_transition_many(changes=changes, actor=actor)
    if refused:  # each is locked and its version checked: nothing can have moved it
        raise refused[0]
    for pk, backing in taken.items():
        _receipt_settled(locked[pk], dispatches.get(pk), action, actor, backing, None)
        outcomes[pk] = Decided(locked[pk], action)
    return outcomes


def _proposed(
    locked: Operation,
    action: str,
    version: int,
    reason: str,
    actor: Actor,
    evidence: Evidence | None,
) -> ReconciliationRequest:
    """A proposal for four eyes, bound to the version and the evidence the proposer saw;
    one at a time per operation (``request_pending``)."""
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
    return request


def _not_backed(action: str, evidence: Evidence | None) -> RecoveryError:
    verdict = evidence.verdict if evidence is not None else "none"
    return RecoveryError(
        ErrorCode.NOT_BACKED,
        f"the latest evidence does not back a {action} (latest verdict: {verdict})",
    )


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
