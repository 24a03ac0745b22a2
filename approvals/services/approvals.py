"""Approvals: requested for one exact action, decided once (or by votes), expired by the
database's clock; and their binding to a provider by name."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django.contrib.auth import get_user_model

from approvals.models import (
    Approval,
    ApprovalVote,
    Approver,
    Permit,
    ReconciliationRequest,
)
from approvals.services.errors import ApprovalError
from audit.chain import audit_transaction_rider, audit_transaction_rides
from common.actors import Actor
from common.errors import ErrorCode
from dbsql import columns
from dbsql.clock import db_now
from dbsql.rows import model_from_row, model_unsaved, select_first
from dbsql.writes import NOW, insert, insert_sql, insert_upserting, update_returning

MAX_TTL_SECONDS = 7 * 24 * 3600
# What a permit whose INSERT rides with the events names (``audit_transaction_rides``),
# with its operation's key: until they are written, nothing may consume it.
PERMIT_RIDES = "permit issued"
PermitWrite = Literal["now", "riding", "held"]
# The same of an approval requested whose INSERT rides (``approval_ride``).
APPROVAL_RIDES = "approval requested"
ApprovalWrite = Literal["now", "held"]


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
    registered: bool = False,
    write: ApprovalWrite = "now",
) -> tuple[Approval, bool]:
    """Open an approval for ``binding``, or return the pending one (``created`` False).

    ``terms``: called with the new approval's id, only when one is made, for what its
    policy asks of it (the values of ``Approval``'s policy fields; an unsaved ``party``
    is upserted by (host, party) with the approval). ``registered``: the operation was
    registered by this very transaction, so no approval of it exists and none is looked
    for (operations are never deleted: a key names one operation, ever).

    ``write``: the approval's INSERT a statement of its own (``now``), or left to the
    caller (``held``), who writes it before anything reads it (``approval_write``) or
    lets it ride with the transaction's events (``approval_ride``). One whose party is
    upserted with it is written here all the same.
    """
    if not registered:
        pending = select_first(
            Approval, operation_key=binding.operation_key, status=Approval.Status.PENDING
        )
        if pending is not None:
            return pending, False
    approval = model_unsaved(
        Approval,
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
    if approval.party is not None and approval.party.pk is None:
        # The party as the host names it now: made or refreshed with the approval.
        insert_upserting(
            approval,
            field="party",
            conflict=("host", "party"),
            update=("display_name", "contact", "updated_at"),
        )
    elif write == "now":
        insert([approval])
    return approval, True


def approval_write(approval: Approval) -> None:
    """Write a held approval (``approval_request``'s ``write``) now, unless it is written
    or riding already."""
    if _unwritten(approval, (APPROVAL_RIDES, approval.operation_key)):
        insert([approval])


def approval_ride(approval: Approval) -> None:
    """Write a held approval with the transaction's events, unless it is written or
    riding already: for a caller whose transaction reads it no more."""
    _ride_unless_written(approval, (APPROVAL_RIDES, approval.operation_key))


def _unwritten(row: Approval | Permit, key: tuple[str, str]) -> bool:
    """Whether ``row`` is neither saved nor riding (under ``key``) with the events."""
    return row._state.adding and not audit_transaction_rides(key)


def _ride_unless_written(row: Approval | Permit, key: tuple[str, str]) -> None:
    if _unwritten(row, key):
        audit_transaction_rider(insert_sql([row]), keys=[key])


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
    permit_write: PermitWrite = "now",
) -> tuple[Approval, Permit | None]:
    """Decide a pending approval of exactly ``binding``; approving issues the permit.

    One compare-and-set on the approval, judged and timed by the database's clock;
    the permit is valid for ``ttl_seconds`` from that moment. A pending approval past
    its ``expires_at`` by that clock is ``approval_expired``, whether or not the sweep
    has come by. An approval decided by votes is decided here only once they are
    ``counted``; before, ``NeedsVotes``.

    ``permit_write``: the permit's INSERT a statement of its own (``now``); riding with
    the transaction's events (``riding``, ``permit_ride``), for a caller whose
    transaction reads no permit after the decision; or left to the caller (``held``):
    a dispatch that follows in the same transaction consumes it as it is written
    (``permit_consume``'s ``issued``), or the caller lets it ride.
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
            columns.prep(Approval, "pk", approval_id),
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
    permit = model_unsaved(
        Permit,
        approval=approval,
        operation_key=binding.operation_key,
        action=binding.action,
        provider=binding.provider,
        params_digest=binding.params_digest,
        issued_at=approval.decided_at,
        expires_at=approval.decided_at + timedelta(seconds=ttl_seconds),
    )
    if permit_write == "riding":
        permit_ride(permit)
    elif permit_write == "now":
        insert([permit])
    return approval, permit


def permit_ride(permit: Permit) -> None:
    """Write ``permit`` with the transaction's events, unless it is written or riding
    already; until they are written, nothing may consume it (``PERMIT_RIDES``)."""
    _ride_unless_written(permit, (PERMIT_RIDES, permit.operation_key))


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
