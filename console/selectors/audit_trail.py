"""The audit trail a console user may read: its filters, pages, export and health.

The chains of the operations of the providers the user may view, and for supervisors
(``recovery.selectors.access.supervises_any_provider``) the system chain. What people do with
the log itself (export records, resolving alarms) is ``console.services.audit_trail``.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from audit.hashing import SYSTEM_CHAIN
from audit.models import AuditCheckpoint, AuditEvent, AuditVerification
from recovery.models import Operation
from recovery.selectors.access import providers_visible_to, supervises_any_provider


@dataclass(frozen=True)
class AuditFilters:
    """What the audit trail is narrowed to; every field optional, all of them combine."""

    actor: str = ""  # a name, or kind:name (user:olivia, system:sweep)
    key: str = ""  # one operation's key: its chain
    kind: str = ""  # an event kind (transition, operator_action, ...)
    provider: str = ""  # a provider's name: the chains of its operations
    since: datetime | None = None  # at or after
    until: datetime | None = None  # before


@dataclass(frozen=True)
class AuditPage:
    rows: list[AuditEvent]
    next_after: int | None  # the id below which the next page starts


def _actor_filter(text: str) -> Q:
    """``name`` or ``kind:name`` against the stored ``kind:id:name`` (or legacy ``kind:name``)."""
    kind, sep, name = text.partition(":")
    if not sep:
        return Q(actor__regex=rf"^[^:]+:([^:]*:)?{re.escape(text)}$")
    return Q(actor__regex=rf"^{re.escape(kind)}:([^:]*:)?{re.escape(name)}$")


def _audit_branches(*, user: Any, filters: AuditFilters) -> list[QuerySet[AuditEvent]]:
    """The chains ``user`` may read, as one query per kind of chain, filters applied.

    The operations' chains and the system chain are read apart and merged by the
    caller: an OR of the two makes PostgreSQL hash every visible operation's key on
    every page, where alone each walks the events backwards along an index.
    """
    visible = providers_visible_to(user=user)
    if filters.provider:
        visible = visible.filter(name=filters.provider)
    # The provider ids as values, not a subquery: then the planner knows how many
    # operations (and so events) they hold, and either walks the newest events back
    # checking each one's operation (a large share) or reads the few operations' chains
    # through (operation_key, seq) and sorts them (a small share).
    provider_ids = list(visible.values_list("pk", flat=True))
    operations = Operation.objects.filter(provider__in=provider_ids).values("key")
    branches = [AuditEvent.objects.filter(operation_key__in=operations)]
    if not filters.provider and not filters.key and supervises_any_provider(user=user):
        branches.append(AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN))
    return [_audit_filtered(events, filters) for events in branches]


def _audit_filtered(events: QuerySet[AuditEvent], filters: AuditFilters) -> QuerySet[AuditEvent]:
    if filters.key:
        events = events.filter(operation_key=filters.key)
    if filters.kind:
        events = events.filter(kind=filters.kind)
    if filters.actor:
        events = events.filter(_actor_filter(filters.actor))
    if filters.since is not None:
        events = events.filter(at__gte=filters.since)
    if filters.until is not None:
        events = events.filter(at__lt=filters.until)
    return events


def audit_events_for_user(
    *, user: Any, filters: AuditFilters, after: int | None, limit: int
) -> AuditPage:
    """One page of the audit trail ``user`` may read, newest first.

    The events of operations of the providers ``user`` may view, and for supervisors
    (``supervises_any_provider``) the system chain. Keyset pagination on id: no OFFSET, no
    COUNT; one row beyond ``limit`` says whether there is a next page.
    """
    rows: list[AuditEvent] = []
    for events in _audit_branches(user=user, filters=filters):
        if after is not None:
            events = events.filter(id__lt=after)
        rows.extend(events.order_by("-id")[: limit + 1])
    rows.sort(key=lambda event: event.pk, reverse=True)
    if len(rows) <= limit:
        return AuditPage(rows, None)
    return AuditPage(rows[:limit], rows[limit - 1].pk)


def audit_events_export_for_user(
    *, user: Any, filters: AuditFilters, chunk_size: int = 2000
) -> Iterator[AuditEvent]:
    """Every event of the filtered trail, oldest first, read in chunks.

    On PostgreSQL ``iterator`` reads through a server-side cursor (one per branch,
    merged by id as they go): a million events never sit in memory at once. Oldest
    first, so that each chain reads in its order.
    """
    return heapq.merge(
        *(
            events.order_by("id").iterator(chunk_size=chunk_size)
            for events in _audit_branches(user=user, filters=filters)
        ),
        key=lambda event: event.pk,
    )


@dataclass(frozen=True)
class AuditHealth:
    """When the log was last verified and checkpointed, as the console shows it."""

    verification: AuditVerification | None
    checkpoint: AuditCheckpoint | None
    problem_visible: bool  # the problem names a chain: supervisors only


def audit_health_for_user(*, user: Any) -> AuditHealth:
    """The newest verification and checkpoint; the problem's detail for supervisors only.

    Everyone who reads any of the trail may know whether the log verified; where it
    broke names an operation key, possibly of a provider they may not view.
    """
    return AuditHealth(
        verification=AuditVerification.objects.order_by("-at", "-id").first(),
        # Not its heads: a first checkpoint's names every chain of the log.
        checkpoint=AuditCheckpoint.objects.defer("heads", "broken").order_by("-number").first(),
        problem_visible=supervises_any_provider(user=user),
    )
