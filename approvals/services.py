"""Approvals and permits: decide, consume (exactly once), revoke.

Callers own the transaction: these functions are called from inside the caller's
``transaction.atomic`` block so the permit change, the caller's own rows and its audit
event commit together.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.actors import Actor
from approvals.models import (
    Approval,
    ApprovalVote,
    Approver,
    Permit,
    PermitEvent,
    ReconciliationRequest,
)
from common.errors import ErrorCode, SettleError
from common.windows import Window
from dbsql.clock import DatabaseNow, db_now
from dbsql.rows import model_from_row, select_first
from dbsql.writes import NOW, insert, insert_where, update_returning

M = TypeVar("M", bound=models.Model)

MAX_TTL_SECONDS = 7 * 24 * 3600
APPROVER_TOKEN_PREFIX = "sta_"


class Refusal:
    """Why a permit was not consumed: the codes a dispatch refusal answers with."""

    NOT_AUTHORIZED = ErrorCode.NOT_AUTHORIZED
    ACTION_MISMATCH = ErrorCode.ACTION_MISMATCH
    EXPIRED = ErrorCode.EXPIRED
    REVOKED = ErrorCode.REVOKED
    ALREADY_CONSUMED = ErrorCode.ALREADY_CONSUMED


class ApprovalError(SettleError):
    """A refused approval or approver; recovery re-raises it with the permit's status."""


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def approver_create(
    *,
    name: str,
    providers: list[str] | None = None,
    hosts: list[str] | None = None,
    all_providers: bool = False,
) -> tuple[Approver, str]:
    """Create an approver credential; the token is returned once and stored hashed.

    Its scope is at least one provider, or ``all_providers``, said explicitly.
    """
    if not (providers or all_providers):
        raise ApprovalError(ErrorCode.EMPTY_SCOPE, "an approver needs a provider, or all providers")
    token, hashed = new_token(APPROVER_TOKEN_PREFIX)
    approver = Approver.objects.create(
        name=name,
        token_hash=hashed,
        all_providers=all_providers,
        providers=sorted(set(providers or [])),
        hosts=sorted(set(hosts or [])),
    )
    return approver, token


def approver_authenticate(*, token: str) -> Approver | None:
    """The active approver holding ``token``; a disabled one is refused at once."""
    return credential_by_token(Approver, token)


def approver_for(*, actor: Actor) -> Approver | None:
    """The active approver credential ``actor`` names; None for any other actor."""
    if actor.kind != "approver" or not actor.id.isdigit():
        return None
    return Approver.objects.filter(pk=int(actor.id), disabled_at=None).first()


def credential_by_token(model: type[M], token: str) -> M | None:
    """The active credential row of ``model`` holding ``token`` (hashed), or None.

    Written out (``dbsql.rows``) rather than built by the ORM: it is the first statement of
    every API call, and building it cost several times what running it does.
    """
    return select_first(model, token_hash=token_hash(token), disabled_at=None)


def new_token(prefix: str) -> tuple[str, str]:
    """A bearer token with its kind's prefix, and the hash that is all Settle keeps."""
    token = prefix + secrets.token_urlsafe(32)
    return token, token_hash(token)


@dataclass(frozen=True)
class Binding:
    """The exact action a permit is for, compared by value."""

    operation_key: str
    action: str
    provider: str
    params_digest: str


def provider_rename(*, old: str, new: str) -> None:
    """Approvals, permits and reconciliation requests bind to the provider by name: they
    follow a rename."""
    for model in (Approval, Permit, ReconciliationRequest):
        model.objects.filter(provider=old).update(provider=new)
    for approver in Approver.objects.all():  # few rows; JSON lookups differ by database
        if old in approver.providers:
            approver.providers = sorted({*approver.providers, new} - {old})
            approver.save(update_fields=["providers"])


def approval_request(
    *,
    binding: Binding,
    requested_by: Actor,
    host: str = "",
    terms: Callable[[uuid.UUID], dict[str, Any]] | None = None,
) -> tuple[Approval, bool]:
    """Open an approval for ``binding``, or return the pending one (``created`` False).

    ``terms``: called with the new approval's id, only when one is made, for what its
    policy asks of it (the values of ``Approval``'s policy fields).
    """
    pending = select_first(
        Approval, operation_key=binding.operation_key, status=Approval.Status.PENDING
    )
    if pending is not None:
        return pending, False
    approval = Approval(
        operation_key=binding.operation_key,
        action=binding.action,
        provider=binding.provider,
        params_digest=binding.params_digest,
        host=host,
        requested_by=requested_by,
    )
    if terms is not None:
        for name, value in terms(approval.id).items():
            setattr(approval, name, value)
    insert([approval])
    return approval, True


class NeedsVotes(Exception):
    """The approval is decided by counting votes (``Approval.voting``), not by one call."""


def approval_resolve(
    *,
    approval_id: Any,
    binding: Binding,
    approve: bool,
    decided_by: Actor,
    ttl_seconds: int,
    reason: str = "",
    counted: bool = False,
) -> tuple[Approval, Permit | None]:
    """Decide a pending approval of exactly ``binding``; approving issues the permit.

    One compare-and-set on the approval, judged and timed by the database's clock;
    the permit is valid for ``ttl_seconds`` from that moment. A pending approval past
    its ``expires_at`` by that clock is ``approval_expired``, whether or not the sweep
    has come by. An approval decided by votes is decided here only once they are
    ``counted``; before, ``NeedsVotes``.
    """
    if not 1 <= ttl_seconds <= MAX_TTL_SECONDS:
        raise ApprovalError(ErrorCode.INVALID_TTL, f"ttl_seconds must be 1..{MAX_TTL_SECONDS}")
    status = Approval.Status.APPROVED if approve else Approval.Status.DENIED
    fields = Approval._meta.concrete_fields
    row = update_returning(
        Approval._meta.db_table,
        "status = %s, decided_by = %s, decided_at = {now}, decision_reason = %s",
        "id = %s AND status = %s AND operation_key = %s AND action = %s AND provider = %s "
        "AND params_digest = %s AND (expires_at IS NULL OR expires_at > {now})"
        + ("" if counted else " AND NOT voting"),
        [
            status,
            decided_by.stored,
            NOW,
            reason,
            Approval._meta.pk.get_db_prep_value(approval_id, connection),
            Approval.Status.PENDING,
            binding.operation_key,
            binding.action,
            binding.provider,
            binding.params_digest,
            NOW,
        ],
        [str(field.column) for field in fields],
    )
    if row is None:
        current = Approval.objects.filter(pk=approval_id).first()
        if current is not None and approval_expired(approval=current):
            raise ApprovalError(ErrorCode.APPROVAL_EXPIRED)
        if current is not None and current.status == Approval.Status.PENDING and current.voting:
            raise NeedsVotes
        if current is None or current.status == Approval.Status.PENDING:
            raise ApprovalError(ErrorCode.UNKNOWN_APPROVAL, "no such approval for this operation")
        raise ApprovalError(ErrorCode.ALREADY_DECIDED, f"approval is already {current.status}")
    approval = model_from_row(Approval, fields, row)
    if not approve:
        return approval, None
    assert approval.decided_at is not None
    permit = Permit(
        approval=approval,
        operation_key=binding.operation_key,
        action=binding.action,
        provider=binding.provider,
        params_digest=binding.params_digest,
        issued_at=approval.decided_at,
        expires_at=approval.decided_at + timedelta(seconds=ttl_seconds),
    )
    insert([permit])
    return approval, permit


def approval_expired(*, approval: Approval) -> bool:
    """Whether a pending approval is past its ``expires_at`` by the database's clock.

    Past it, no decision counts, though the sweep may not have closed it yet. Once past,
    always past: a read after a refused compare-and-set judges it as that statement did.
    """
    if approval.status != Approval.Status.PENDING or approval.expires_at is None:
        return False
    return approval.expires_at <= db_now()


def approval_vote(
    *,
    approval: Approval,
    voter: Actor,
    approve: bool,
    reason: str,
    signature: dict[str, Any] | None = None,
) -> tuple[ApprovalVote, int]:
    """Record one person's decision on a pending approval; returns it and the approvals
    counted so far (its own included).

    The caller holds the lock on the approval's operation, so votes on one approval are
    counted one at a time. A voter decides once: the same person again is
    ``already_voted``, however the first vote went and whatever they are called now
    (votes are unique on ``Actor.identity``). Two accounts with one e-mail address (a
    directory account and a break-glass one, say) are one person: the second is
    ``already_voted`` too.
    """
    if _same_email_voted(approval=approval, voter=voter):
        raise ApprovalError(
            ErrorCode.ALREADY_VOTED,
            "another account with your e-mail address has decided this approval already",
        )
    vote = ApprovalVote(
        approval=approval,
        voter=voter,
        voter_identity=voter.identity,
        approve=approve,
        reason=reason,
        params_digest=approval.params_digest,
        at=db_now(),
        signature=signature or {},
    )
    if not insert([vote], unless_conflict=True):
        raise ApprovalError(ErrorCode.ALREADY_VOTED, "you have decided this approval already")
    if not approve:
        return vote, 0
    approvals = approval.votes.filter(approve=True).count() if approval.required > 1 else 1
    return vote, approvals


def _same_email_voted(*, approval: Approval, voter: Actor) -> bool:
    """Whether another user with ``voter``'s e-mail address (compared case-insensitively;
    none: nobody) has voted on ``approval``. E-mail addresses as they are now."""
    if voter.kind != "user" or not voter.id.isdigit():
        return False
    users = get_user_model()._default_manager
    email_field = get_user_model().get_email_field_name()
    email = users.filter(pk=int(voter.id)).values_list(email_field, flat=True).first()
    if not email:
        return False
    voted = approval.votes.filter(voter_identity__startswith="user:").values_list(
        "voter_identity", flat=True
    )
    ids = [int(ident) for _, _, ident in (v.partition(":") for v in voted) if ident.isdigit()]
    others = users.filter(pk__in=ids, **{f"{email_field}__iexact": email})
    return others.exclude(pk=int(voter.id)).exists()


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


def permit_consume(*, binding: Binding, presented_digest: str, actor: Actor) -> ConsumeResult:
    """Consume the operation's permit for exactly ``binding``, or say why not.

    One compare-and-set: the permit must be active, bound to exactly this action and
    digest, and unexpired by the database's clock read by that very statement — so a
    permit that expires while this call waits on a lock is refused as ``expired``
    rather than consumed late. Every refusal is written to the permit's history.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("permit_consume must run inside the caller's transaction")
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
        at=db_now(),
        detail={"reason": reason, "status": permit.status},
    )
    return False
