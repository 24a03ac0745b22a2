"""Reads of approvals and permits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from approvals.actors import Actor
from approvals.models import Approval, ApprovalVote, Permit, PermitEvent


def approval_needed(*, approval: Approval, approvals: int) -> str:
    """What a pending approval still needs, as hosts and people read it ("1 of 2 approvals")."""
    if approval.status != Approval.Status.PENDING:
        return ""
    return f"{approvals} of {approval.required} approvals"


def approval_votes(*, approval: Approval) -> list[ApprovalVote]:
    """The people who decided so far, in the order they did."""
    return list(approval.votes.order_by("at", "id"))


def permit_history(
    permit: Permit, *, events: Iterable[PermitEvent] | None = None, row: bool = True
) -> list[dict[str, Any]]:
    """Every line of a permit's history, oldest first.

    Issue, consumption and revocation are read from the permit's row (unless ``row`` is
    False: a later page of the history); refusals, ignored revocations and expiry from
    its events (``events``: a page of them; else ``permit.events``, maybe prefetched).
    """
    lines: list[tuple[datetime, int, dict[str, Any]]] = []

    def line(
        kind: str, at: datetime, actor: Actor | None, detail: dict[str, Any], order: int
    ) -> None:
        lines.append(
            (at, order, {"kind": kind, "reason": "", "actor": actor, "at": at, "detail": detail})
        )

    if row:
        line(
            PermitEvent.Kind.ISSUED,
            permit.issued_at,
            permit.approval.decided_by,
            {"ttl_seconds": round((permit.expires_at - permit.issued_at).total_seconds())},
            0,
        )
        if permit.consumed_at is not None:
            line(
                PermitEvent.Kind.CONSUMED,
                permit.consumed_at,
                permit.consumed_by,
                {"presented_digest": permit.params_digest},
                1,
            )
        if permit.revoked_at is not None:
            line(
                PermitEvent.Kind.REVOKED,
                permit.revoked_at,
                permit.revoked_by,
                {"reason": permit.revoke_reason, "status": Permit.Status.REVOKED},
                1,
            )
    for event in permit.events.all() if events is None else events:
        lines.append(
            (
                event.at,
                2,
                {
                    "id": event.pk,
                    "kind": event.kind,
                    "reason": event.reason,
                    "actor": event.actor,
                    "at": event.at,
                    "detail": event.detail,
                },
            )
        )
    lines.sort(key=lambda item: (item[0], item[1]))
    return [entry for _, _, entry in lines]
