"""Signed provider callbacks: evidence the provider sends, unless stale (rule 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.chain import audit_transaction
from common.actors import Actor
from common.errors import ErrorCode
from recovery.adapters import LookupResult, signature_valid
from recovery.models import (
    Evidence,
    Operation,
    Provider,
    State,
    Verdict,
)
from recovery.services.errors import NotFound
from recovery.services.evidence import evidence_apply
from recovery.services.locking import operation_lock
from recovery.services.refusals import refusals_recorded
from recovery.services.stale_signals import stale_signal
from recovery.vocabulary import StaleSignal


def callback_signature_valid(*, provider: Provider, body: bytes, signature: str) -> bool:
    return signature_valid(secret=provider.secret, body=body, signature=signature)


@dataclass(frozen=True)
class CallbackOutcome:
    applied: bool
    state: str
    reason: str = ""


@refusals_recorded(actor=lambda kwargs: Actor.of("provider", kwargs["provider"]))
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
        raise NotFound(
            ErrorCode.UNKNOWN_OPERATION, f"no operation {operation_key!r} at this provider"
        )
    operation = operation_lock(operation)
    actor = Actor.of("provider", provider)
    last = operation.last_callback_sequence
    if last is not None and sequence <= last:
        stale_signal(
            operation=operation,
            signal=StaleSignal.STALE_CALLBACK_SEQUENCE,
            actor=actor,
            data={"sequence": sequence, "applied_sequence": last, "status": status},
        )
        return CallbackOutcome(False, operation.state, "stale_sequence")
    if operation.state in (State.RELEASED, State.VOIDED):
        stale_signal(
            operation=operation,
            signal=StaleSignal.CALLBACK_AFTER_SETTLEMENT,
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
