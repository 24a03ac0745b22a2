"""Evidence and the rules it is judged by: only ``match`` releases (rule 4)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.chain import audit_append
from audit.kinds import AuditKind
from common.actors import Actor
from common.canonical import canonical_dumps, sha256_digest
from dbsql.batches import bulk_save
from recovery.adapters import LookupResult
from recovery.changes import RECEIPT_COMPLETE, OperationChange, changes_record
from recovery.models import (
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    State,
    Verdict,
)
from recovery.services.stale_signals import stale_signal
from recovery.transitions import (
    Change,
    Event,
    TransitionRefused,
    operation_transition,
    operation_transition_many,
)
from recovery.vocabulary import StaleSignal, WaitReason

# After an inconclusive lookup (absent / unavailable), the next is due after roughly
# this long (three times longer each time), give or take LOOKUP_BACKOFF_JITTER of it.
LOOKUP_BACKOFF_SECONDS = (5, 15, 45, 120, 300, 900)
LOOKUP_BACKOFF_JITTER = 0.2


def evidence_apply(
    *,
    operation: Operation,
    result: LookupResult,
    source: str,
    actor: Actor,
    lookup: LookupAttempt | None = None,
) -> Evidence:
    """Store the evidence and let it move the operation, if the rules allow.

    Only ``match`` releases (rule 4); a verified record of "not performed" fails the
    operation; contradicting the host's own report is a conflict for an operator
    (rule 5); anything arriving after a verified completion is a stale signal.
    Must run inside the caller's transaction with ``operation`` locked. A batch of one
    (``evidence_apply_many``) whose refused transition is raised, to roll it back.
    """
    applied = evidence_apply_many(
        found=[EvidenceFound(operation, lookup, result)], source=source, actor=actor
    )
    if applied.refused:
        raise applied.refused[0]
    return applied.evidences[0]


@dataclass(frozen=True)
class EvidenceFound:
    """One answer: the locked operation, the lookup attempt that asked (if one did), and
    what was found."""

    operation: Operation
    lookup: LookupAttempt | None
    result: LookupResult


@dataclass(frozen=True)
class EvidenceApplied:
    """The evidence stored, in the order it was found, and the transitions refused."""

    evidences: list[Evidence]
    refused: list[TransitionRefused]


def evidence_apply_many(
    *, found: list[EvidenceFound], source: str, actor: Actor
) -> EvidenceApplied:
    """``evidence_apply`` for a batch, in a few statements; each refusal on its own.

    Evidence rows are inserted in one statement and the attempts closed in one; each
    operation is then judged by the same rules (``_evidence_judge``), and the batch's
    transitions applied in one statement (``operation_transition_many``), each still a
    compare-and-set on its own row; the recovered receipts are written in one more. A
    refused one (the operation moved on) is recorded as a stale signal and the others go
    ahead: the refused transition wrote nothing (its event is taken back, and a
    judgement writes nothing before its transition).
    Must run inside the caller's transaction with every operation locked.
    """
    if not found:
        return EvidenceApplied([], [])
    now = timezone.now()
    evidences = Evidence.objects.bulk_create(
        [_evidence_new(item.operation, item.result, source, now) for item in found]
    )
    lookups = []
    for item, evidence in zip(found, evidences, strict=True):
        if item.lookup is not None:
            _lookup_finished(item.lookup, evidence, now)
            lookups.append(item.lookup)
    bulk_save(lookups, ["evidence", "finished_at", "status"])
    receipts = {
        dispatch.operation_id: dispatch
        for dispatch in Dispatch.objects.filter(operation__in=[item.operation for item in found])
    }
    judged = []
    refused: list[tuple[TransitionRefused, Evidence]] = []
    for item, evidence in zip(found, evidences, strict=True):
        _evidence_audit(item.operation, evidence, actor)
        receipt = receipts.get(item.operation.pk)
        judgement = _evidence_judge(item.operation, evidence, receipt)
        if judgement.change is not None:
            judged.append((item.operation, evidence, receipt, judgement))
            continue
        try:  # a stale signal, or an inconclusive lookup: rarely many, one by one
            _judgement_apply(item.operation, evidence, actor, judgement)
        except TransitionRefused as exc:
            refused.append((exc, evidence))
    # Every transition of the batch in one compare-and-set statement.
    by_key = {operation.key: evidence for operation, evidence, _, _ in judged}
    refused += [
        (refusal, by_key[refusal.operation_key])
        for refusal in operation_transition_many(
            changes=[judgement.change for *_, judgement in judged if judgement.change],
            actor=actor,
        )
    ]
    gone = {refusal.operation_key for refusal, _ in refused}
    receipts_complete(
        completions=[
            ReceiptCompletion(operation, receipt, evidence.provider_status == "committed", evidence)
            for operation, evidence, receipt, judgement in judged
            if judgement.recover and receipt is not None and operation.key not in gone
        ],
        actor=actor,
    )
    operations = {item.operation.key: item.operation for item in found}
    for refusal, evidence in refused:
        stale_signal(
            operation=operations[refusal.operation_key],
            signal=StaleSignal.TRANSITION_REFUSED,
            actor=actor,
            data={"event": refusal.event, "reason": refusal.reason, "evidence_id": evidence.pk},
        )
    return EvidenceApplied(evidences, [refusal for refusal, _ in refused])


def _evidence_new(operation: Operation, result: LookupResult, source: str, now: Any) -> Evidence:
    raw = result.raw
    return Evidence(
        operation=operation,
        source=source,
        verdict=result.verdict,
        provider_status=result.provider_status,
        provider_reference=result.reference[:200],
        detail=result.detail[:500],
        raw=raw,
        raw_digest=sha256_digest(canonical_dumps(raw)),
        captured_at=now,
        absent_is_authoritative=operation.provider.absent_is_authoritative,
    )


def _lookup_finished(lookup: LookupAttempt, evidence: Evidence, now: Any) -> None:
    lookup.evidence = evidence
    lookup.finished_at = now
    lookup.status = LookupAttempt.Status.FINISHED


def _evidence_audit(operation: Operation, evidence: Evidence, actor: Actor) -> None:
    audit_append(
        kind=AuditKind.EVIDENCE,
        operation=operation,
        actor=actor,
        data={
            "source": evidence.source,
            "evidence_id": evidence.pk,
            "verdict": evidence.verdict,
            "provider_status": evidence.provider_status,
            "raw_digest": evidence.raw_digest,
        },
    )


@dataclass(frozen=True)
class _Judgement:
    """What one piece of evidence does to its operation, by the rules.

    A transition (``change``, then perhaps completing the stranded receipt from the
    evidence), or only a stale signal, or an inconclusive lookup counted; or nothing.
    """

    change: Change | None = None
    recover: bool = False
    signal: StaleSignal | None = None
    inconclusive: bool = False


def _evidence_ref(evidence: Evidence) -> dict[str, Any]:
    return {"evidence_id": evidence.pk, "verdict": evidence.verdict}


def _evidence_judge(
    operation: Operation, evidence: Evidence, receipt: Dispatch | None
) -> _Judgement:
    """Decide, writing nothing: a batch then applies every transition in one statement."""
    state = operation.state
    verdict = evidence.verdict
    committed = verdict == Verdict.MATCH and evidence.provider_status == "committed"
    not_performed = verdict == Verdict.MATCH and evidence.provider_status == "failed"
    ref = _evidence_ref(evidence)

    if state == State.FAILED and committed:
        return _Judgement(Change(operation, Event.CONFLICT, ref))
    if state not in (State.DISPATCHED, State.UNKNOWN, State.RECONCILE):
        if state == State.RELEASED and committed:
            return _Judgement()
        return _Judgement(
            signal=StaleSignal.EVIDENCE_AFTER_SETTLEMENT
            if operation.is_terminal
            else StaleSignal.EVIDENCE_EARLY
        )
    if committed or not_performed:
        assert receipt is not None
        contradicts = (committed and receipt.receipt_status == Dispatch.ReceiptStatus.FAILED) or (
            not_performed and receipt.receipt_status == Dispatch.ReceiptStatus.SUCCEEDED
        )
        if contradicts:
            if state == State.RECONCILE:
                return _Judgement()
            return _Judgement(Change(operation, Event.CONFLICT, ref))
        event = Event.EVIDENCE_MATCH if committed else Event.EVIDENCE_NOT_PERFORMED
        return _Judgement(
            # The receipt is complete after this change (recovered now if running).
            Change(
                operation,
                event,
                ref,
                {"recovered": True, "next_lookup_at": None, "receipt_running": False},
            ),
            recover=receipt.receipt_status == Dispatch.ReceiptStatus.RUNNING,
        )
    if verdict in (Verdict.MISMATCH, Verdict.CORRUPT):
        if state == State.RECONCILE:
            return _Judgement()
        return _Judgement(Change(operation, Event.ESCALATE, ref, {"next_lookup_at": None}))
    # absent / unavailable: inconclusive; never success, never another attempt.
    return _Judgement(inconclusive=state == State.UNKNOWN)


def _judgement_apply(
    operation: Operation, evidence: Evidence, actor: Actor, judgement: _Judgement
) -> None:
    """A judgement without a transition of its own: a stale signal, or an inconclusive
    lookup counted (which escalates once the provider's lookup budget is spent)."""
    if judgement.signal:
        stale_signal(
            operation=operation, signal=judgement.signal, actor=actor, data=_evidence_ref(evidence)
        )
    elif judgement.inconclusive:
        _inconclusive(operation, actor, _evidence_ref(evidence))


def _inconclusive(operation: Operation, actor: Actor, ref: dict[str, Any]) -> None:
    count = operation.lookups_inconclusive + 1
    if count >= operation.provider.lookup_budget:
        operation_transition(
            operation=operation,
            event=Event.ESCALATE,
            actor=actor,
            data={
                **ref,
                "reason": WaitReason.LOOKUP_BUDGET_SPENT,
                "lookups": count,
                "detail": f"evidence unavailable after {count} lookups",
            },
            lookups_inconclusive=count,
            next_lookup_at=None,
        )
        return
    base = LOOKUP_BACKOFF_SECONDS[min(count - 1, len(LOOKUP_BACKOFF_SECONDS) - 1)]
    # Jitter, so that the operations of one crash storm do not all come due together.
    delay = base * random.uniform(1 - LOOKUP_BACKOFF_JITTER, 1 + LOOKUP_BACKOFF_JITTER)
    Operation.objects.filter(pk=operation.pk).update(
        lookups_inconclusive=count, next_lookup_at=timezone.now() + timedelta(seconds=delay)
    )
    operation.lookups_inconclusive = count


RECEIPT_RECOVERED_FIELDS = [
    "receipt_status",
    "receipt_recovered",
    "receipt_evidence",
    "receipt_request",
    "receipt_reference",
    "receipt_reported_at",
]


@dataclass(frozen=True)
class ReceiptCompletion:
    """A stranded receipt to complete, as ``succeeded`` or not, and what backs it:
    verified ``evidence``, or a four-eyes ``request`` where no evidence did; one of them."""

    operation: Operation
    dispatch: Dispatch
    succeeded: bool
    evidence: Evidence | None = None
    request: ReconciliationRequest | None = None


def receipt_complete(
    *,
    operation: Operation,
    dispatch: Dispatch,
    succeeded: bool,
    actor: Actor,
    evidence: Evidence | None = None,
    request: ReconciliationRequest | None = None,
) -> None:
    """Complete a stranded receipt as a recovery receipt, pointing at what backs it:
    ``receipts_complete`` of one."""
    completion = ReceiptCompletion(operation, dispatch, succeeded, evidence, request)
    receipts_complete(completions=[completion], actor=actor)


def receipts_complete(*, completions: list[ReceiptCompletion], actor: Actor) -> None:
    """Complete stranded receipts as recovery receipts, each pointing at what backs it,
    in one UPDATE. Must run with their operations locked (a dispatch changes only under
    its operation's lock)."""
    now = timezone.now()
    grounds = [
        _receipt_completed(item.dispatch, item.succeeded, item.evidence, item.request, now)
        for item in completions
    ]
    bulk_save([item.dispatch for item in completions], RECEIPT_RECOVERED_FIELDS)
    for item, ground in zip(completions, grounds, strict=True):
        _receipt_audit(item.operation, item.dispatch, ground, actor)
    changes_record(
        [
            _receipt_change(item.operation, item.dispatch, ground)
            for item, ground in zip(completions, grounds, strict=True)
        ]
    )


def _receipt_change(
    operation: Operation, dispatch: Dispatch, grounds: dict[str, Any]
) -> OperationChange:
    """A receipt completed, for the recorders of changes: its status and what backs it."""
    data = {**grounds, "receipt_status": dispatch.receipt_status}
    return OperationChange(operation, RECEIPT_COMPLETE, operation.state, data)


def _receipt_completed(
    dispatch: Dispatch,
    succeeded: bool,
    evidence: Evidence | None,
    request: ReconciliationRequest | None,
    now: Any,
) -> dict[str, Any]:
    """Set the receipt's fields (not saved); what backs it, for its audit event."""
    assert (evidence is None) != (request is None)
    dispatch.receipt_status = (
        Dispatch.ReceiptStatus.SUCCEEDED if succeeded else Dispatch.ReceiptStatus.FAILED
    )
    dispatch.receipt_recovered = True
    dispatch.receipt_evidence = evidence
    dispatch.receipt_request = request
    if evidence is not None:
        dispatch.receipt_reference = evidence.provider_reference
    dispatch.receipt_reported_at = now
    return receipt_grounds(evidence, request)


def receipt_grounds(
    evidence: Evidence | None, request: ReconciliationRequest | None
) -> dict[str, Any]:
    """What backs an operator's decision or a recovery receipt, as its audit events name it."""
    if evidence is not None:
        return {"evidence_id": evidence.pk}
    assert request is not None
    return {"request_id": request.pk}


def _receipt_audit(
    operation: Operation, dispatch: Dispatch, grounds: dict[str, Any], actor: Actor
) -> None:
    audit_append(
        kind=AuditKind.RECEIPT_RECOVERED,
        operation=operation,
        actor=actor,
        data={**grounds, "status": dispatch.receipt_status},
    )


# A lookup's lease: the provider's timeout plus this. A running attempt whose lease
# lapsed belongs to a process that died mid-lookup; the next attempt abandons it.
