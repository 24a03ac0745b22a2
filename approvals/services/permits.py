"""Permits: consumed exactly once for the exact action, refused with a reason (each
refusal on the permit's history, its volume bounded per window), revoked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import (
    Permit,
    PermitEvent,
)
from approvals.services.approvals import PERMIT_RIDES, Binding, permit_ride
from approvals.services.errors import Refusal
from audit.chain import audit_transaction_rides
from common.actors import Actor
from common.windows import Window
from dbsql.clock import DatabaseNow, db_now
from dbsql.rows import model_from_row
from dbsql.writes import NOW, insert, insert_where, update_returning


class Recorded:
    """How a refusal went into the permit's history."""

    EVENT = "event"  # a line of its own
    SUMMARY = "summary"  # the first one past the window's limit: a summary line opened
    COUNTED = "counted"  # counted in the window's summary line


@dataclass(frozen=True)
class ConsumeResult:
    permit: Permit | None
    refusal: str = ""
    recorded: str = Recorded.EVENT
    window: tuple[datetime, datetime] | None = None  # the summary's, when not an EVENT
    # An earlier window's summary line with this reason, closed by this refusal: its
    # final count, for the caller to put on the audit chain.
    closed: dict[str, Any] | None = None

    @property
    def consumed(self) -> bool:
        return not self.refusal


def refusal_window(at: datetime) -> tuple[datetime, datetime]:
    """The window of ``SETTLE_REFUSAL_WINDOW_SECONDS`` that ``at`` falls in."""
    window = Window.at(at, settings.SETTLE_REFUSAL_WINDOW_SECONDS)
    return window.start, window.end


def _refuse(permit: Permit, reason: str, actor: Actor, detail: dict[str, Any]) -> ConsumeResult:
    """Write the refusal to the permit's history, one line each up to the window's limit.

    Past ``SETTLE_REFUSALS_RECORDED_PER_MINUTE`` refusals with one reason in a window,
    one summary line counts the rest (``count``, first and last time), updated by each
    in the caller's transaction: every refusal stays on the record, its volume does not
    grow with the caller's rate. The permit is locked (``permit_refusal``), so the
    count is exact.
    """
    # This process's clock, not the database's that judges permits: a window bounds how
    # many lines are written, it decides nothing, and reading the database's clock would
    # cost the refusal path a statement of its own.
    now = timezone.now()
    start, end = refusal_window(now)
    limit = settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE
    line = PermitEvent(
        permit=permit,
        kind=PermitEvent.Kind.REFUSED,
        reason=reason,
        actor=actor,
        detail=detail,
        at=now,
    )
    q = connection.ops.quote_name
    table, permit_id, at = (q(PermitEvent._meta.db_table), q("permit_id"), q("at"))
    # One statement on the path taken all day: the line goes in while the window holds
    # fewer than ``limit`` lines with this reason.
    in_window = (
        f"SELECT 1 FROM {table} WHERE {permit_id} = %s AND {q('kind')} = %s "
        f"AND {q('reason')} = %s AND {at} >= %s AND {at} < %s LIMIT %s"
    )
    window_params = [
        Permit._meta.pk.get_db_prep_value(permit.pk, connection),
        PermitEvent.Kind.REFUSED,
        reason,
        connection.ops.adapt_datetimefield_value(start),
        connection.ops.adapt_datetimefield_value(end),
        limit,
    ]
    if insert_where(line, f"(SELECT COUNT(*) FROM ({in_window}) w) < %s", [*window_params, limit]):
        return ConsumeResult(permit=permit, refusal=reason)
    # Past the limit: this window's lines (the summary, if opened, is the newest) and the
    # newest summary of an earlier window, to close it now that its count is final.
    rows = list(
        PermitEvent.objects.filter(permit=permit, kind=PermitEvent.Kind.REFUSED, reason=reason)
        .filter(Q(at__gte=start, at__lt=end) | Q(at__lt=start, detail__has_key="count"))
        .order_by("-id")
        .values_list("pk", "at", "detail")[: limit + 2]
    )
    recorded = [(pk, detail) for pk, at, detail in rows if at >= start]
    earlier = next(((pk, detail) for pk, at, detail in rows if at < start), None)
    closed = _summary_close(*earlier) if earlier else None
    if len(recorded) == limit:
        PermitEvent.objects.create(
            permit=permit,
            kind=PermitEvent.Kind.REFUSED,
            reason=reason,
            actor=actor,
            detail={
                "count": 1,
                "first_at": now.isoformat(),
                "last_at": now.isoformat(),
                "window_start": start.isoformat(),
                "window_end": end.isoformat(),
            },
            at=now,
        )
        return ConsumeResult(permit, reason, Recorded.SUMMARY, (start, end), closed)
    pk, summary = recorded[0]
    # The latest refused caller, as of the summary's last_at.
    PermitEvent.objects.filter(pk=pk).update(
        actor=actor,
        detail={**summary, "count": int(summary.get("count", 1)) + 1, "last_at": now.isoformat()},
    )
    return ConsumeResult(permit, reason, Recorded.COUNTED, (start, end), closed)


def _summary_close(pk: int, summary: dict[str, Any]) -> dict[str, Any] | None:
    """An earlier window's summary line, marked closed unless it was: its count is final."""
    if summary.get("closed"):
        return None
    closed = {**summary, "closed": True}
    PermitEvent.objects.filter(pk=pk).update(detail=closed)
    return {**closed, "permit_event_id": pk}


def permit_consume(
    *, binding: Binding, presented_digest: str, actor: Actor, issued: Permit | None = None
) -> ConsumeResult:
    """Consume the operation's permit for exactly ``binding``, or say why not.

    One compare-and-set: the permit must be active, bound to exactly this action and
    digest, and unexpired by the database's clock read by that very statement — so a
    permit that expires while this call waits on a lock is refused as ``expired``
    rather than consumed late. Every refusal is written to the permit's history.

    ``issued``: the permit this transaction's decision issued and left to it, not
    written yet (``approval_resolve``'s ``held``). Bound to exactly ``binding`` and the
    digest presented, it is written already consumed, with the transaction's events:
    one INSERT for an INSERT and an UPDATE, its issue the moment of its consumption
    (one transaction; its time to live at least a second). Else it is written as
    issued, and refused as any permit.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("permit_consume must run inside the caller's transaction")
    if issued is not None:
        if presented_digest == binding.params_digest and _binds(issued, binding):
            issued.status = Permit.Status.CONSUMED
            issued.consumed_at = issued.issued_at
            issued.consumed_by = actor
            permit_ride(issued)
            return ConsumeResult(permit=issued)
        insert([issued])  # before its refusal's history names it
    if audit_transaction_rides((PERMIT_RIDES, binding.operation_key)):
        raise RuntimeError("the permit rides with this transaction's events: not written yet")
    if presented_digest == binding.params_digest:
        fields = Permit._meta.concrete_fields
        row = update_returning(
            Permit._meta.db_table,
            "status = %s, consumed_at = {now}, consumed_by = %s",
            "operation_key = %s AND status = %s AND action = %s AND provider = %s "
            "AND params_digest = %s AND expires_at > {now}",
            [
                Permit.Status.CONSUMED,
                NOW,
                actor.stored,
                binding.operation_key,
                Permit.Status.ACTIVE,
                binding.action,
                binding.provider,
                binding.params_digest,
                NOW,
            ],
            [str(field.column) for field in fields],
        )
        if row is not None:
            return ConsumeResult(permit=model_from_row(Permit, fields, row))
    return permit_refusal(binding=binding, presented_digest=presented_digest, actor=actor)


def _binds(permit: Permit, binding: Binding) -> bool:
    return (
        permit.status == Permit.Status.ACTIVE
        and permit.operation_key == binding.operation_key
        and permit.action == binding.action
        and permit.provider == binding.provider
        and permit.params_digest == binding.params_digest
    )


def permit_refusal(*, binding: Binding, presented_digest: str, actor: Actor) -> ConsumeResult:
    """Why the operation's permit cannot be consumed for ``binding``; recorded.

    For a caller that already knows consumption cannot succeed (the operation moved
    past approval), and for ``permit_consume`` when its compare-and-set changed nothing.
    """
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
    if permit.status == Permit.Status.ACTIVE:
        # Active and bound exactly, yet not consumed: its time ran out.
        _permit_mark_expired(permit)
    return _refuse(permit, Refusal.EXPIRED, actor, detail)


def _permit_mark_expired(permit: Permit) -> None:
    changed = Permit.objects.filter(pk=permit.pk, status=Permit.Status.ACTIVE).update(
        status=Permit.Status.EXPIRED
    )
    if changed:
        permit.status = Permit.Status.EXPIRED
        PermitEvent.objects.create(permit=permit, kind=PermitEvent.Kind.EXPIRED, at=db_now())


def permit_mark_revoked(*, permit: Permit, reason: str, actor: Actor) -> bool:
    """Revoke an active permit. False when there was nothing left to guard.

    Revocation guards the future, not the past: a consumed (or already expired/revoked)
    permit keeps its status, and the request is written to its history. The caller
    reads ``permit`` under its lock; the compare-and-set still guards a stale read.
    """
    if permit.status == Permit.Status.ACTIVE:
        changed = Permit.objects.filter(pk=permit.pk, status=Permit.Status.ACTIVE).update(
            status=Permit.Status.REVOKED,
            revoked_at=DatabaseNow(),
            revoked_by=actor,
            revoke_reason=reason,
        )
        if changed:
            permit.status, permit.revoked_by, permit.revoke_reason = (
                Permit.Status.REVOKED,
                actor,
                reason,
            )
            return True
        permit.refresh_from_db(fields=["status"])
    PermitEvent.objects.create(
        permit=permit,
        kind=PermitEvent.Kind.REVOKE_IGNORED,
        actor=actor,
        # Read by the INSERT itself: no statement of its own on the revocation's path.
        at=DatabaseNow(),
        detail={"reason": reason, "status": permit.status},
    )
    return False
