"""Approvals and permits: decide, consume (exactly once), revoke.

Callers own the transaction: these functions are called from inside the caller's
``transaction.atomic`` block so the permit change, the caller's own rows and its audit
event commit together.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from approvals.models import Approval, Approver, Permit, PermitEvent

MAX_TTL_SECONDS = 7 * 24 * 3600


class Refusal:
    NOT_AUTHORIZED = "not_authorized"
    ACTION_MISMATCH = "action_mismatch"
    EXPIRED = "expired"
    REVOKED = "revoked"
    ALREADY_CONSUMED = "already_consumed"


class ApprovalError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def db_now() -> datetime:
    """The database's clock: permits and leases are judged by it, not by a web worker's."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            value: datetime = cursor.fetchone()[0]
            return value
    return timezone.now()


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def approver_create(*, name: str) -> tuple[Approver, str]:
    """Create an approver credential; the token is returned once and stored hashed."""
    token = "sta_" + secrets.token_urlsafe(32)
    approver = Approver.objects.create(name=name, token_hash=token_hash(token))
    return approver, token


def approver_authenticate(*, token: str) -> Approver | None:
    return Approver.objects.filter(token_hash=token_hash(token)).first()


@dataclass(frozen=True)
class Binding:
    """The exact action a permit is for, compared by value."""

    operation_key: str
    action: str
    provider: str
    params_digest: str


def approval_request(*, binding: Binding, requested_by: str) -> tuple[Approval, bool]:
    """Open an approval for ``binding``, or return the pending one (``created`` False)."""
    pending = Approval.objects.filter(
        operation_key=binding.operation_key, status=Approval.Status.PENDING
    ).first()
    if pending is not None:
        return pending, False
    approval = Approval.objects.create(
        operation_key=binding.operation_key,
        action=binding.action,
        provider=binding.provider,
        params_digest=binding.params_digest,
        requested_by=requested_by,
    )
    return approval, True


def approval_decide(
    *, approval: Approval, approve: bool, decided_by: str, ttl_seconds: int
) -> Permit | None:
    """Decide a pending approval; approving issues the permit, valid for ``ttl_seconds``."""
    if not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise ApprovalError("invalid_ttl", f"ttl_seconds must be 1..{MAX_TTL_SECONDS}")
    now = db_now()
    status = Approval.Status.APPROVED if approve else Approval.Status.DENIED
    changed = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
        status=status, decided_by=decided_by, decided_at=now
    )
    if changed != 1:
        approval.refresh_from_db()
        raise ApprovalError("already_decided", f"approval is already {approval.status}")
    approval.status, approval.decided_by, approval.decided_at = status, decided_by, now
    if not approve:
        return None
    permit = Permit.objects.create(
        approval=approval,
        operation_key=approval.operation_key,
        action=approval.action,
        provider=approval.provider,
        params_digest=approval.params_digest,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds),
    )
    PermitEvent.objects.create(
        permit=permit,
        kind=PermitEvent.Kind.ISSUED,
        actor=decided_by,
        at=now,
        detail={"ttl_seconds": ttl_seconds},
    )
    return permit


@dataclass(frozen=True)
class ConsumeResult:
    permit: Permit | None
    refusal: str = ""

    @property
    def consumed(self) -> bool:
        return not self.refusal


def _refuse(permit: Permit, reason: str, actor: str, detail: dict[str, Any]) -> ConsumeResult:
    PermitEvent.objects.create(
        permit=permit,
        kind=PermitEvent.Kind.REFUSED,
        reason=reason,
        actor=actor,
        detail=detail,
        at=db_now(),
    )
    return ConsumeResult(permit=permit, refusal=reason)


def permit_consume(*, binding: Binding, presented_digest: str, actor: str) -> ConsumeResult:
    """Consume the operation's permit for exactly ``binding``, or say why not.

    Every refusal is written to the permit's history. The final compare-and-set reads
    the database clock, so a permit that expires while this call waits on a lock is
    refused as ``expired`` rather than consumed late.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("permit_consume must run inside the caller's transaction")
    permit = (
        Permit.objects.select_for_update()
        .filter(operation_key=binding.operation_key)
        .order_by("-issued_at")
        .first()
    )
    if permit is None:
        return ConsumeResult(permit=None, refusal=Refusal.NOT_AUTHORIZED)
    detail = {"presented_digest": presented_digest}
    if permit.status == Permit.Status.CONSUMED:
        return _refuse(permit, Refusal.ALREADY_CONSUMED, actor, detail)
    if permit.status == Permit.Status.REVOKED:
        return _refuse(permit, Refusal.REVOKED, actor, detail)
    bound = Binding(permit.operation_key, permit.action, permit.provider, permit.params_digest)
    if bound != binding or presented_digest != permit.params_digest:
        return _refuse(permit, Refusal.ACTION_MISMATCH, actor, detail)
    if permit.status == Permit.Status.EXPIRED:
        return _refuse(permit, Refusal.EXPIRED, actor, detail)
    # Read the clock only now, with the operation and permit locked: this is the moment
    # of consumption, however long the locks took.
    now = db_now()
    changed = Permit.objects.filter(
        pk=permit.pk, status=Permit.Status.ACTIVE, expires_at__gt=now
    ).update(status=Permit.Status.CONSUMED, consumed_at=now)
    if changed != 1:
        _permit_mark_expired(permit)
        return _refuse(permit, Refusal.EXPIRED, actor, detail)
    permit.status, permit.consumed_at = Permit.Status.CONSUMED, now
    PermitEvent.objects.create(
        permit=permit, kind=PermitEvent.Kind.CONSUMED, actor=actor, at=now, detail=detail
    )
    return ConsumeResult(permit=permit)


def _permit_mark_expired(permit: Permit) -> None:
    changed = Permit.objects.filter(pk=permit.pk, status=Permit.Status.ACTIVE).update(
        status=Permit.Status.EXPIRED
    )
    if changed:
        permit.status = Permit.Status.EXPIRED
        PermitEvent.objects.create(permit=permit, kind=PermitEvent.Kind.EXPIRED, at=db_now())


def permit_revoke(*, permit: Permit, reason: str, actor: str) -> bool:
    """Revoke an active permit. Returns False when there was nothing left to guard.

    Revocation guards the future, not the past: a consumed (or already expired/revoked)
    permit keeps its status, and the request is still written to its history.
    """
    now = db_now()
    changed = Permit.objects.filter(pk=permit.pk, status=Permit.Status.ACTIVE).update(
        status=Permit.Status.REVOKED, revoked_at=now, revoke_reason=reason
    )
    permit.refresh_from_db()
    kind = PermitEvent.Kind.REVOKED if changed else PermitEvent.Kind.REVOKE_IGNORED
    PermitEvent.objects.create(
        permit=permit,
        kind=kind,
        actor=actor,
        at=now,
        detail={"reason": reason, "status": permit.status},
    )
    return bool(changed)
