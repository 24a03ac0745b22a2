"""The recovery core: register, approve, dispatch once, report, look up, resume.

Every function that writes runs one explicit ``audit_transaction``, changes state only
through ``operation_transition`` and audits in the same transaction.

Lock order, the same everywhere, so that no two calls can wait on each other in a
cycle:

1. the operation row (``operation_lock``: ``FOR NO KEY UPDATE OF`` the operation only,
   never its provider or host, and the operation's audit chain with it);
2. then the approvals rows bound to that operation (approval, permit);
3. then its dispatch and host receipt.

Nothing else is locked: rows of other operations are never touched, the audit log has
no global head (an operation's chain is guarded by the operation's lock; the system
chain by an advisory lock), and no lock is held across a network call — lookups read
the provider outside any transaction and apply the answer under the lock afterwards.
"""

from __future__ import annotations

import hmac
import math
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection
from django.db.models import QuerySet, Subquery
from django.utils import timezone

from approvals import services as approvals
from approvals.models import Approval, Permit
from recovery.adapters import LookupResult, ProviderConfig, evidence_lookup, signature_valid
from recovery.audit import (
    audit_append,
    audit_chain_locked,
    audit_head_new,
    audit_head_write,
    audit_transaction,
)
from recovery.canonical import canonical_dumps, canonical_params, params_digest, sha256_digest
from recovery.models import (
    UNSETTLED_STATES,
    Dispatch,
    Evidence,
    Host,
    LookupAttempt,
    Operation,
    Provider,
    State,
    Verdict,
)
from recovery.transitions import Event, TransitionRefused, operation_transition


class RecoveryError(Exception):
    """A refused request; ``code`` is the stable error code the API returns."""

    status = 409

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class NotFound(RecoveryError):
    status = 404


class Invalid(RecoveryError):
    status = 422


# -- credentials and providers ------------------------------------------------------


def host_create(*, name: str) -> tuple[Host, str]:
    """Create a host credential; the token is shown once and stored hashed."""
    token = "sth_" + secrets.token_urlsafe(32)
    host = Host.objects.create(name=name, token_hash=approvals.token_hash(token))
    return host, token


def host_authenticate(*, token: str) -> Host | None:
    return Host.objects.filter(token_hash=approvals.token_hash(token)).first()


@audit_transaction()
def provider_configure(
    *,
    name: str,
    adapter: str,
    path: str = "",
    url: str = "",
    secret: str = "",
    timeout_seconds: float | None = None,
    lease_seconds: int | None = None,
    actor: str = "admin",
) -> tuple[Provider, bool]:
    """Create or update a provider's adapter settings (an administrator's act, audited)."""
    if adapter not in Provider.Adapter.values:
        raise Invalid("invalid_adapter", f"adapter must be one of {Provider.Adapter.values}")
    if adapter in {Provider.Adapter.SQLITE, Provider.Adapter.JOURNAL} and not path:
        raise Invalid("missing_path", f"the {adapter} adapter needs --path")
    if adapter == Provider.Adapter.HTTP and not (url and secret):
        raise Invalid("missing_url", "the http adapter needs --url and --secret")
    if timeout_seconds is not None and not 0 < timeout_seconds <= 60:
        raise Invalid("invalid_timeout", "timeout must be more than 0 and at most 60 seconds")
    if lease_seconds is not None and lease_seconds < 1:
        raise Invalid("invalid_lease", "lease must be at least 1 second")
    provider = Provider.objects.select_for_update().filter(name=name).first()
    created = provider is None
    if provider is None:
        provider = Provider(name=name)
    provider.adapter, provider.path, provider.url = adapter, path, url
    if secret:
        provider.secret = secret
    if timeout_seconds is not None:
        provider.timeout_seconds = timeout_seconds
    if lease_seconds is not None:
        provider.lease_seconds = lease_seconds
    provider.save()
    audit_append(
        kind="provider_configured",
        actor=actor,
        data={
            "provider": name,
            "adapter": adapter,
            "path": path,
            "url": url,
            "timeout_seconds": provider.timeout_seconds,
            "lease_seconds": provider.lease_seconds,
            "secret_changed": bool(secret),
        },
    )
    return provider, created


def provider_config(provider: Provider) -> ProviderConfig:
    return ProviderConfig(
        adapter=provider.adapter,
        path=provider.path,
        url=provider.url,
        secret=provider.secret,
        timeout_seconds=provider.timeout_seconds,
    )


# -- registration and approval ------------------------------------------------------


@dataclass(frozen=True)
class OperationRef:
    """An operation named by its key among one host's operations, not read yet.

    The host API passes these, so that finding the operation and locking it are one
    statement; ``NotFound`` when the host has no such operation.
    """

    key: str
    host: Host


def operations_locked() -> QuerySet[Operation]:
    """Operations as they are read for writing: locked, with their provider.

    ``of=("self",)`` locks the operation row only, never its provider or host;
    ``no_key`` lets concurrent inserts that reference the operation (dispatch,
    evidence) check their foreign key freely.
    """
    return Operation.objects.select_for_update(of=("self",), no_key=True).select_related("provider")


def operation_lock(operation: Operation | OperationRef) -> Operation:
    """Lock ``operation`` (first in the lock order) and read it afresh; its chain with it."""
    if isinstance(operation, OperationRef):
        found = operations_locked().filter(key=operation.key, host=operation.host).first()
        if found is None:
            raise NotFound("unknown_operation", f"no operation {operation.key!r} for this host")
        return audit_chain_locked(found)
    return audit_chain_locked(operations_locked().get(pk=operation.pk))


def operation_read(operation: Operation | OperationRef) -> Operation:
    """The operation as it is now, without a lock."""
    if isinstance(operation, OperationRef):
        found = (
            Operation.objects.select_related("provider")
            .filter(key=operation.key, host=operation.host)
            .first()
        )
        if found is None:
            raise NotFound("unknown_operation", f"no operation {operation.key!r} for this host")
        return found
    return Operation.objects.select_related("provider").get(pk=operation.pk)


def _binding(operation: Operation) -> approvals.Binding:
    return approvals.Binding(
        operation_key=operation.key,
        action=operation.action,
        provider=operation.provider.name,
        params_digest=operation.params_digest,
    )


def operation_register(
    *, host: Host, key: str, action: str, provider_name: str, params: Any
) -> tuple[Operation, bool]:
    """Persist the intended effect before anything is dispatched; idempotent per key.

    The same registration again returns the existing operation; the same key with any
    difference (host, action, provider or params) is a ``key_conflict``.
    """
    canonical = canonical_params(params)
    digest = params_digest(canonical)
    provider = Provider.objects.filter(name=provider_name).first()
    if provider is None:
        raise NotFound("unknown_provider", f"no provider named {provider_name!r}")
    try:
        with audit_transaction():
            operation = Operation(
                key=key,
                host=host,
                action=action,
                provider=provider,
                params_canonical=canonical,
                params_digest=digest,
                state=State.AWAITING_APPROVAL,
            )
            audit_head_new(operation)
            audit_append(
                kind="registered",
                operation=operation,
                actor=f"host:{host.name}",
                data={"action": action, "provider": provider_name, "params_digest": digest},
            )
            # The chain's head goes into the row with it: one INSERT, event aside.
            audit_head_write(operation)
            operation.save(force_insert=True)
            return operation, True
    except IntegrityError:
        existing = Operation.objects.select_related("provider").filter(key=key).first()
        if existing is None:
            raise
    same = (
        existing.host_id == host.pk
        and existing.action == action
        and existing.provider_id == provider.pk
        and existing.params_digest == digest
    )
    if not same:
        raise RecoveryError("key_conflict", f"operation {key!r} exists with a different action")
    return existing, False


@audit_transaction()
def approval_open(*, operation: Operation | OperationRef, host: Host) -> tuple[Approval, bool]:
    """Ask for a decision on the operation's exact action (or return the pending one)."""
    operation = operation_lock(operation)
    if operation.state != State.AWAITING_APPROVAL:
        raise RecoveryError(
            "invalid_state",
            f"operation is {operation.state}; no approval can be opened",
            state=operation.state,
        )
    approval, created = approvals.approval_request(
        binding=_binding(operation), requested_by=f"host:{host.name}"
    )
    if created:
        audit_append(
            kind="approval_requested",
            operation=operation,
            actor=f"host:{host.name}",
            data={"approval_id": str(approval.id)},
        )
    return approval, created


@audit_transaction()
def approval_decision(
    *, approval_id: uuid.UUID, approve: bool, ttl_seconds: int, decided_by: str
) -> tuple[Approval, Permit | None]:
    """Record an approver's decision and move the operation with it."""
    approval_key = Approval.objects.filter(pk=approval_id).values("operation_key")[:1]
    operation = operations_locked().filter(key=Subquery(approval_key)).first()
    if operation is None:
        if Approval.objects.filter(pk=approval_id).exists():
            raise NotFound("unknown_operation", "the approval's operation does not exist")
        raise NotFound("unknown_approval", "no such approval")
    operation = audit_chain_locked(operation)
    try:
        approval, permit = approvals.approval_decide(
            approval_id=approval_id,
            binding=_binding(operation),
            approve=approve,
            decided_by=decided_by,
            ttl_seconds=ttl_seconds,
        )
    except approvals.ApprovalError as exc:
        current = Approval.objects.filter(pk=approval_id).values_list("status", flat=True)
        raise RecoveryError(exc.code, exc.message, status=current.first()) from exc
    if permit is not None:
        audit_append(
            kind="permit_issued",
            operation=operation,
            actor=decided_by,
            data={
                "permit_id": str(permit.id),
                "params_digest": permit.params_digest,
                "expires_at": permit.expires_at.isoformat(),
            },
        )
    operation_transition(
        operation=operation,
        event=Event.APPROVE if approve else Event.DENY,
        actor=decided_by,
        data={"approval_id": str(approval.id)},
    )
    return approval, permit


@audit_transaction()
def permit_revoke(
    *, permit_id: uuid.UUID, reason: str, actor: str, host: Host | None = None
) -> tuple[Permit, bool]:
    """Revoke a permit; an approved operation that can no longer dispatch is closed.

    ``host``: the permit must be for one of this host's operations (else not found).
    """
    permit_key = Permit.objects.filter(pk=permit_id).values("operation_key")[:1]
    operations = operations_locked().filter(key=Subquery(permit_key))
    if host is not None:
        operations = operations.filter(host=host)
    operation = operations.first()
    if operation is None:
        raise NotFound("unknown_permit", "no such permit")
    operation = audit_chain_locked(operation)
    permit = Permit.objects.select_for_update().get(pk=permit_id)
    revoked = approvals.permit_revoke(permit=permit, reason=reason, actor=actor)
    audit_append(
        kind="permit_revoked" if revoked else "permit_revoke_ignored",
        operation=operation,
        actor=actor,
        data={"permit_id": str(permit.id), "reason": reason, "permit_status": permit.status},
    )
    if revoked and operation.state == State.APPROVED:
        operation_transition(operation=operation, event=Event.REVOKE, actor=actor)
    return permit, revoked


# -- dispatch, heartbeat, report ----------------------------------------------------


@dataclass(frozen=True)
class DispatchOutcome:
    refusal: str = ""
    dispatch: Dispatch | None = None
    state: str = ""


@audit_transaction()
def operation_dispatch(
    *, operation: Operation | OperationRef, worker: str, presented_digest: str, actor: str
) -> DispatchOutcome:
    """Consume the permit and create the one dispatch, atomically, or record the refusal."""
    operation = operation_lock(operation)
    # Only an approved operation's permit can still be consumed; for any other, skip
    # the attempt and go straight to recording why not.
    consume = (
        approvals.permit_consume if operation.state == State.APPROVED else approvals.permit_refusal
    )
    result = consume(binding=_binding(operation), presented_digest=presented_digest, actor=actor)
    permit = result.permit
    permit_id = str(permit.id) if permit else ""
    if not result.consumed:
        if result.refusal == approvals.Refusal.EXPIRED and operation.state == State.APPROVED:
            operation_transition(operation=operation, event=Event.EXPIRE, actor=actor)
        audit_append(
            kind="consume_refused",
            operation=operation,
            actor=actor,
            data={"reason": result.refusal, "permit_id": permit_id, "worker": worker},
        )
        return DispatchOutcome(refusal=result.refusal, state=operation.state)
    assert permit is not None and permit.consumed_at is not None
    now = permit.consumed_at  # the database's clock, read by the consumption itself
    dispatch = Dispatch.objects.create(
        operation=operation,
        permit_id=permit.id,
        fencing_token=secrets.token_urlsafe(24),
        worker=worker,
        created_at=now,
        lease_expires_at=now + timedelta(seconds=operation.provider.lease_seconds),
    )
    audit_append(
        kind="permit_consumed",
        operation=operation,
        actor=actor,
        data={"permit_id": permit_id, "worker": worker},
    )
    operation_transition(
        operation=operation, event=Event.DISPATCH, actor=actor, data={"worker": worker}
    )
    return DispatchOutcome(dispatch=dispatch, state=operation.state)


def _dispatch_for_token(operation: Operation, fencing_token: str, actor: str) -> Dispatch:
    dispatch = Dispatch.objects.filter(operation=operation).first()
    presented = fencing_token.encode("utf-8", "surrogatepass")
    if dispatch is None or not hmac.compare_digest(dispatch.fencing_token.encode(), presented):
        stale_signal(
            operation=operation,
            signal="stale_fencing_token",
            actor=actor,
            data={"dispatched": dispatch is not None},
        )
        raise RecoveryError(
            "stale_fencing_token", "this fencing token does not hold the operation's dispatch"
        )
    return dispatch


def operation_heartbeat(
    *, operation: Operation | OperationRef, fencing_token: str, actor: str
) -> Dispatch:
    """Extend the lease of a live dispatch; a stale token changes nothing and is recorded.

    A lease that already lapsed is lost, whoever notices first: the heartbeat moves the
    operation to ``unknown`` itself, so a stalled worker learns it may not carry on.
    """
    refusal: RecoveryError | None = None
    with audit_transaction():
        operation = operation_lock(operation)
        try:
            dispatch = _dispatch_for_token(operation, fencing_token, actor)
        except RecoveryError as exc:
            refusal = exc
        else:
            now = approvals.db_now()
            if operation.state == State.DISPATCHED and dispatch.lease_expires_at <= now:
                _lease_lapsed(operation, dispatch, actor)
            if operation.state != State.DISPATCHED:
                stale_signal(
                    operation=operation, signal="heartbeat_after_lease", actor=actor, data={}
                )
                refusal = RecoveryError(
                    "lease_lost",
                    f"the operation is {operation.state}; the lease is gone",
                    state=operation.state,
                )
            else:
                dispatch.last_heartbeat_at = now
                dispatch.lease_expires_at = now + timedelta(
                    seconds=operation.provider.lease_seconds
                )
                dispatch.save(update_fields=["last_heartbeat_at", "lease_expires_at"])
    # Raised after commit, so that the signal (and a lost lease) stay on the record.
    if refusal is not None:
        raise refusal
    return dispatch


@dataclass(frozen=True)
class ReportOutcome:
    applied: bool
    state: str
    receipt_status: str


def operation_report(
    *,
    operation: Operation | OperationRef,
    fencing_token: str,
    outcome: str,
    provider_reference: str,
    actor: str,
) -> ReportOutcome:
    """Record the worker's own result. The first report wins; later ones are signals."""
    with audit_transaction():
        operation = operation_lock(operation)
        try:
            dispatch = _dispatch_for_token(operation, fencing_token, actor)
        except RecoveryError as exc:
            refusal = exc
        else:
            return _report_apply(operation, dispatch, outcome, provider_reference, actor)
    # Raised after commit, so that the stale signal stays on the record.
    raise refusal


def _report_apply(
    operation: Operation, dispatch: Dispatch, outcome: str, reference: str, actor: str
) -> ReportOutcome:
    report = {"outcome": outcome, "provider_reference": reference}
    if dispatch.receipt_status != Dispatch.ReceiptStatus.RUNNING:
        stale_signal(
            operation=operation,
            signal="duplicate_report",
            actor=actor,
            data={**report, "receipt_status": dispatch.receipt_status},
        )
        return ReportOutcome(False, operation.state, dispatch.receipt_status)
    committed = outcome == "committed"
    dispatch.receipt_status = (
        Dispatch.ReceiptStatus.SUCCEEDED if committed else Dispatch.ReceiptStatus.FAILED
    )
    dispatch.receipt_reference = reference
    dispatch.receipt_reported_at = timezone.now()
    dispatch.save(update_fields=["receipt_status", "receipt_reference", "receipt_reported_at"])
    audit_append(kind="host_report", operation=operation, actor=actor, data=report)
    if operation.state == State.DISPATCHED:
        operation_transition(
            operation=operation, event=Event.COMMIT if committed else Event.FAIL, actor=actor
        )
    else:
        # The lease lapsed first: only provider evidence may settle it now.
        stale_signal(
            operation=operation,
            signal="report_after_lease",
            actor=actor,
            data={**report, "state": operation.state},
        )
    return ReportOutcome(True, operation.state, dispatch.receipt_status)


def stale_signal(*, operation: Operation, signal: str, actor: str, data: dict[str, Any]) -> None:
    """Record something that arrived too late or out of turn; it changes nothing else."""
    audit_append(
        kind="stale_signal",
        operation=operation,
        actor=actor,
        data={"signal": signal, "state": operation.state, "version": operation.version, **data},
    )


def transition_refused_record(exc: TransitionRefused, actor: str) -> None:
    """Record a refused transition in a transaction of its own (the change rolled back)."""
    with audit_transaction():
        operation = operations_locked().filter(key=exc.operation_key).first()
        if operation is not None:
            audit_chain_locked(operation)
        audit_append(
            kind="stale_signal",
            operation=operation,
            actor=actor,
            data={
                "signal": "transition_refused",
                "event": exc.event,
                "reason": exc.reason,
                "state": exc.state,
                "version": exc.version,
            },
        )


# -- evidence ---------------------------------------------------------------------


LOOKUP_BACKOFF_SECONDS = (5, 15, 45, 120, 300, 900)


def _receipt(operation: Operation) -> Dispatch | None:
    """The operation's dispatch, which holds the host's receipt (under the operation lock)."""
    return Dispatch.objects.filter(operation=operation).first()


def evidence_apply(
    *,
    operation: Operation,
    result: LookupResult,
    source: str,
    actor: str,
    lookup: LookupAttempt | None = None,
) -> Evidence:
    """Store the evidence and let it move the operation, if the rules allow.

    Only ``match`` releases (rule 4); a verified record of "not performed" fails the
    operation; contradicting the host's own report is a conflict for an operator
    (rule 5); anything arriving after a verified completion is a stale signal.
    Must run inside the caller's transaction with ``operation`` locked.
    """
    now = timezone.now()
    raw = result.raw
    evidence = Evidence.objects.create(
        operation=operation,
        source=source,
        verdict=result.verdict,
        provider_status=result.provider_status,
        provider_reference=result.reference[:200],
        detail=result.detail[:500],
        raw=raw,
        raw_digest=sha256_digest(canonical_dumps(raw)),
        captured_at=now,
    )
    if lookup is not None:
        lookup.evidence = evidence
        lookup.finished_at = now
        lookup.status = LookupAttempt.Status.FINISHED
        lookup.save(update_fields=["evidence", "finished_at", "status"])
    audit_append(
        kind="evidence",
        operation=operation,
        actor=actor,
        data={
            "source": source,
            "evidence_id": evidence.pk,
            "verdict": result.verdict,
            "provider_status": result.provider_status,
            "raw_digest": evidence.raw_digest,
        },
    )
    _evidence_decide(operation, evidence, actor)
    return evidence


def _evidence_decide(operation: Operation, evidence: Evidence, actor: str) -> None:
    state = operation.state
    verdict = evidence.verdict
    committed = verdict == Verdict.MATCH and evidence.provider_status == "committed"
    not_performed = verdict == Verdict.MATCH and evidence.provider_status == "failed"
    receipt = _receipt(operation)
    ref = {"evidence_id": evidence.pk, "verdict": verdict}

    if state == State.FAILED and committed:
        operation_transition(operation=operation, event=Event.CONFLICT, actor=actor, data=ref)
        return
    if state not in (State.DISPATCHED, State.UNKNOWN, State.RECONCILE):
        if not (state == State.RELEASED and committed):
            signal = "evidence_after_settlement" if operation.is_terminal else "evidence_early"
            stale_signal(operation=operation, signal=signal, actor=actor, data=ref)
        return
    if committed or not_performed:
        assert receipt is not None
        contradicts = (committed and receipt.receipt_status == Dispatch.ReceiptStatus.FAILED) or (
            not_performed and receipt.receipt_status == Dispatch.ReceiptStatus.SUCCEEDED
        )
        if contradicts:
            if state != State.RECONCILE:
                operation_transition(
                    operation=operation, event=Event.CONFLICT, actor=actor, data=ref
                )
            return
        event = Event.EVIDENCE_MATCH if committed else Event.EVIDENCE_NOT_PERFORMED
        operation_transition(
            operation=operation,
            event=event,
            actor=actor,
            data=ref,
            recovered=True,
            next_lookup_at=None,
        )
        if receipt.receipt_status == Dispatch.ReceiptStatus.RUNNING:
            _receipt_recover(operation, receipt, evidence, actor)
        return
    if verdict in (Verdict.MISMATCH, Verdict.CORRUPT):
        if state != State.RECONCILE:
            operation_transition(
                operation=operation,
                event=Event.ESCALATE,
                actor=actor,
                data=ref,
                next_lookup_at=None,
            )
        return
    # absent / unavailable: inconclusive; never success, never another attempt.
    if state == State.UNKNOWN:
        _inconclusive(operation, actor, ref)


def _inconclusive(operation: Operation, actor: str, ref: dict[str, Any]) -> None:
    count = operation.lookups_inconclusive + 1
    if count >= operation.provider.lookup_budget:
        operation_transition(
            operation=operation,
            event=Event.ESCALATE,
            actor=actor,
            data={**ref, "reason": "lookup_budget_spent", "lookups": count},
            lookups_inconclusive=count,
            next_lookup_at=None,
        )
        return
    delay = LOOKUP_BACKOFF_SECONDS[min(count - 1, len(LOOKUP_BACKOFF_SECONDS) - 1)]
    Operation.objects.filter(pk=operation.pk).update(
        lookups_inconclusive=count, next_lookup_at=timezone.now() + timedelta(seconds=delay)
    )
    operation.lookups_inconclusive = count


def _receipt_recover(
    operation: Operation, dispatch: Dispatch, evidence: Evidence, actor: str
) -> None:
    """Complete a stranded receipt from verified evidence (a recovery receipt)."""
    committed = evidence.provider_status == "committed"
    dispatch.receipt_status = (
        Dispatch.ReceiptStatus.SUCCEEDED if committed else Dispatch.ReceiptStatus.FAILED
    )
    dispatch.receipt_recovered = True
    dispatch.receipt_evidence = evidence
    dispatch.receipt_reference = evidence.provider_reference
    dispatch.receipt_reported_at = timezone.now()
    dispatch.save(
        update_fields=[
            "receipt_status",
            "receipt_recovered",
            "receipt_evidence",
            "receipt_reference",
            "receipt_reported_at",
        ]
    )
    audit_append(
        kind="receipt_recovered",
        operation=operation,
        actor=actor,
        data={"evidence_id": evidence.pk, "status": dispatch.receipt_status},
    )


# A lookup's lease: the provider's timeout plus this. A running attempt whose lease
# lapsed belongs to a process that died mid-lookup; the next attempt abandons it.
LOOKUP_LEASE_MARGIN = timedelta(seconds=5)
# How often an operation in reconcile is looked at again by resume (operators can look
# up at any time): its evidence may be repaired at the provider.
RECONCILE_RECHECK = timedelta(seconds=LOOKUP_BACKOFF_SECONDS[-2])


@dataclass(frozen=True)
class LookupSlot:
    """The outcome of asking to look up: the attempt that may run, or when to ask again."""

    operation: Operation  # as it stood under the lock
    attempt: LookupAttempt | None
    retry_after: int = 0


def _seconds_until(moment: Any, now: Any) -> int:
    return max(1, math.ceil((moment - now).total_seconds()))  # type: ignore[no-any-return]


def lookup_start(
    *,
    operation: Operation,
    trigger: str,
    actor: str,
    due_only: bool,
    provider_limit: int = 0,
    for_resume: bool = False,
) -> LookupSlot:
    """Claim the operation's one lookup slot, or say when to ask again.

    Refused while another lookup of the operation is running (its lease alive), while
    ``due_only`` and the next lookup is not due, and while ``provider_limit`` lookups of
    the same provider are already running (for lookups inside web requests, so that one
    slow provider cannot hold every web worker). ``for_resume``: only an unsettled
    operation is looked up, and a dispatch whose lease lapsed is first moved to
    ``unknown`` — in the same transaction, under the same lock.
    """
    with audit_transaction():
        operation = operation_lock(operation)
        if for_resume and operation.state == State.DISPATCHED:
            dispatch = Dispatch.objects.get(operation=operation)
            if dispatch.lease_expires_at > approvals.db_now():
                return LookupSlot(operation, None)  # its worker still holds it
            _lease_lapsed(operation, dispatch, actor)
        if for_resume and operation.state not in UNSETTLED_STATES:
            return LookupSlot(operation, None)
        now = timezone.now()
        if due_only and operation.next_lookup_at is not None and operation.next_lookup_at > now:
            return LookupSlot(operation, None, _seconds_until(operation.next_lookup_at, now))
        running = (
            LookupAttempt.objects.select_for_update()
            .filter(operation=operation, status=LookupAttempt.Status.RUNNING)
            .first()
        )
        if running is not None:
            if running.lease_expires_at > now:
                return LookupSlot(operation, None, _seconds_until(running.lease_expires_at, now))
            running.status = LookupAttempt.Status.ABANDONED
            running.save(update_fields=["status"])
            audit_append(
                kind="lookup_abandoned",
                operation=operation,
                actor=actor,
                data={"lookup_id": running.pk, "started_at": running.started_at.isoformat()},
            )
        if provider_limit and _provider_lookups_running(operation.provider, now) >= provider_limit:
            return LookupSlot(operation, None, math.ceil(operation.provider.timeout_seconds))
        attempt = LookupAttempt.objects.create(
            operation=operation,
            trigger=trigger,
            started_at=now,
            lease_expires_at=now
            + timedelta(seconds=operation.provider.timeout_seconds)
            + LOOKUP_LEASE_MARGIN,
        )
        attempt.operation = operation
        return LookupSlot(operation, attempt)


def _provider_lookups_running(provider: Provider, now: Any) -> int:
    """Running in-request lookups of ``provider``; serialised per provider on PostgreSQL."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_PROVIDER_LOOKUPS, provider.pk])
    return LookupAttempt.objects.filter(
        operation__provider=provider,
        trigger=LookupAttempt.Trigger.RESUME,
        status=LookupAttempt.Status.RUNNING,
        lease_expires_at__gt=now,
    ).count()


_PROVIDER_LOOKUPS = 0x5E77


def lookup_finish(*, attempt: LookupAttempt, result: LookupResult, actor: str) -> Operation:
    """Apply what a lookup found, under the operation lock, and close the attempt.

    Whatever happened since the lookup started is judged by the current state (rule 5).
    An operation still in ``reconcile`` is looked at again after ``RECONCILE_RECHECK``.
    """
    try:
        with audit_transaction():
            locked = operation_lock(attempt.operation)
            evidence_apply(
                operation=locked,
                result=result,
                source=Evidence.Source.LOOKUP,
                actor=actor,
                lookup=attempt,
            )
            if locked.state == State.RECONCILE:
                locked.next_lookup_at = timezone.now() + RECONCILE_RECHECK
                Operation.objects.filter(pk=locked.pk).update(next_lookup_at=locked.next_lookup_at)
            return locked
    except TransitionRefused as exc:
        transition_refused_record(exc, actor)
        LookupAttempt.objects.filter(pk=attempt.pk, status=LookupAttempt.Status.RUNNING).update(
            status=LookupAttempt.Status.FINISHED, finished_at=timezone.now()
        )
        return Operation.objects.select_related("provider").get(pk=attempt.operation_id)


def lookup_run(*, attempt: LookupAttempt, actor: str) -> Operation:
    """Read the provider's record for a claimed attempt and apply it.

    The network call runs outside any transaction and holds no database lock.
    """
    operation = attempt.operation
    result = evidence_lookup(
        config=provider_config(operation.provider),
        operation_key=operation.key,
        params_digest=operation.params_digest,
    )
    return lookup_finish(attempt=attempt, result=result, actor=actor)


def operation_lookup(*, operation: Operation, trigger: str, actor: str) -> Operation:
    """Look up now, whatever the schedule, unless a lookup of it is already running."""
    slot = lookup_start(operation=operation, trigger=trigger, actor=actor, due_only=False)
    if slot.attempt is None:
        return Operation.objects.select_related("provider").get(pk=operation.pk)
    return lookup_run(attempt=slot.attempt, actor=actor)


# -- provider callbacks -------------------------------------------------------------


def callback_signature_valid(*, provider: Provider, body: bytes, signature: str) -> bool:
    return signature_valid(secret=provider.secret, body=body, signature=signature)


@dataclass(frozen=True)
class CallbackOutcome:
    applied: bool
    state: str
    reason: str = ""


@audit_transaction()
def provider_callback(
    *,
    provider: Provider,
    operation_key: str,
    status: str,
    params_digest: str,
    reference: str,
    sequence: int,
    raw: dict[str, Any],
) -> CallbackOutcome:
    """Apply a signed provider notification unless it is stale (rule 5)."""
    operation = Operation.objects.filter(key=operation_key, provider=provider).first()
    if operation is None:
        raise NotFound("unknown_operation", f"no operation {operation_key!r} at this provider")
    operation = operation_lock(operation)
    actor = f"provider:{provider.name}"
    last = operation.last_callback_sequence
    if last is not None and sequence <= last:
        stale_signal(
            operation=operation,
            signal="stale_callback_sequence",
            actor=actor,
            data={"sequence": sequence, "applied_sequence": last, "status": status},
        )
        return CallbackOutcome(False, operation.state, "stale_sequence")
    if operation.state in (State.RELEASED, State.VOIDED):
        stale_signal(
            operation=operation,
            signal="callback_after_settlement",
            actor=actor,
            data={"sequence": sequence, "status": status},
        )
        return CallbackOutcome(False, operation.state, "settled")
    Operation.objects.filter(pk=operation.pk).update(last_callback_sequence=sequence)
    operation.last_callback_sequence = sequence
    verdict = Verdict.MATCH if params_digest == operation.params_digest else Verdict.MISMATCH
    result = LookupResult(
        verdict=verdict,
        provider_status=status,
        reference=reference,
        raw=raw,
        detail=f"signed callback, sequence {sequence}",
    )
    evidence_apply(operation=operation, result=result, source=Evidence.Source.CALLBACK, actor=actor)
    return CallbackOutcome(True, operation.state)


# -- resume ---------------------------------------------------------------------------


class Decision:
    WAIT = "wait"
    DISPATCH = "dispatch"
    IN_PROGRESS = "in_progress"
    RELEASED = "released"
    UNKNOWN = "unknown"
    RECONCILE = "reconcile"
    CLOSED = "closed"


@dataclass(frozen=True)
class ResumeOutcome:
    decision: str
    state: str
    recovered: bool
    fencing_token: str = ""
    # Seconds until asking again is worth it: set when no lookup was made this time.
    retry_after: int = 0


_SETTLED_DECISIONS = {
    State.RELEASED: Decision.RELEASED,
    State.UNKNOWN: Decision.UNKNOWN,
    State.RECONCILE: Decision.RECONCILE,
    State.AWAITING_APPROVAL: Decision.WAIT,
    # Approved but not consumed by this call (a refusal was recorded): not ours to run.
    State.APPROVED: Decision.WAIT,
    State.DISPATCHED: Decision.IN_PROGRESS,
}


def _answer(operation: Operation, retry_after: int = 0) -> ResumeOutcome:
    decision = _SETTLED_DECISIONS.get(State(operation.state), Decision.CLOSED)
    return ResumeOutcome(decision, operation.state, operation.recovered, retry_after=retry_after)


def _lease_lapsed(operation: Operation, dispatch: Dispatch, actor: str) -> None:
    """The worker went quiet past its lease: the outcome is unknown until evidence says."""
    operation_transition(
        operation=operation,
        event=Event.LEASE_LOST,
        actor=actor,
        data={"lease_expires_at": dispatch.lease_expires_at.isoformat()},
        next_lookup_at=timezone.now(),
    )


def operation_resume(
    *, operation: Operation | OperationRef, worker: str, actor: str
) -> ResumeOutcome:
    """What a fresh worker should do about ``operation``; never a second dispatch.

    Only an operation that was never dispatched can be dispatched, by winning its
    permit. A lapsed lease or an unsettled operation is looked up synchronously (bounded
    by the provider's timeout) and released only on matching evidence — but only when
    its next lookup is due, no other lookup of it is running and the provider has a free
    in-request lookup slot; otherwise the answer is what is known, with ``retry_after``.
    """
    if isinstance(operation, OperationRef):
        operation = operation_read(operation)
    if operation.state == State.APPROVED:
        outcome = operation_dispatch(
            operation=operation,
            worker=worker,
            presented_digest=operation.params_digest,
            actor=actor,
        )
        if outcome.dispatch is not None:
            return ResumeOutcome(
                Decision.DISPATCH, outcome.state, False, outcome.dispatch.fencing_token
            )
        operation.refresh_from_db()
    if operation.state in (State.DISPATCHED, *UNSETTLED_STATES):
        slot = lookup_start(
            operation=operation,
            trigger=LookupAttempt.Trigger.RESUME,
            actor=actor,
            due_only=True,
            provider_limit=settings.SETTLE_WEB_LOOKUPS_PER_PROVIDER,
            for_resume=True,
        )
        if slot.attempt is None:
            return _answer(slot.operation, slot.retry_after)
        operation = lookup_run(attempt=slot.attempt, actor=actor)
    return _answer(operation)
