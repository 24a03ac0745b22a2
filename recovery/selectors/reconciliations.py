"""Four-eyes reconciliation requests: the pending proposals a console user may see.

Each with its operation and the operation's latest evidence, so the page can tell a
proposal the operation has since moved past.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from approvals.models import ReconciliationRequest
from recovery.models import Evidence, Operation
from recovery.selectors.access import operation_for_user, providers_visible_to


@dataclass(frozen=True)
class ProposalRow:
    """A pending proposal with its operation and the operation's latest evidence."""

    request: ReconciliationRequest
    operation: Operation
    evidence: Evidence | None

    @property
    def changed(self) -> bool:
        """The operation or its evidence moved on since the proposal (approving fails)."""
        seen = self.evidence.pk if self.evidence is not None else None
        return (
            self.operation.version != self.request.operation_version
            or seen != self.request.evidence_seen
        )


RECONCILIATIONS_SHOWN = 200


def _latest_evidence() -> QuerySet[Evidence]:
    return Evidence.objects.filter(operation=OuterRef("pk")).order_by("-captured_at", "-id")


def reconciliation_requests_for_user(*, user: Any) -> list[ProposalRow]:
    """Pending proposals of the providers ``user`` may view, oldest first.

    Bounded: the oldest ``RECONCILIATIONS_SHOWN``; a queue of proposals is short by
    nature (each waits for one approval), and the oldest are the ones to act on.
    """
    names = providers_visible_to(user=user).values("name")
    requests = list(
        ReconciliationRequest.objects.filter(
            status=ReconciliationRequest.Status.PENDING, provider__in=names
        ).order_by("proposed_at", "id")[:RECONCILIATIONS_SHOWN]
    )
    operations = {
        operation.key: operation
        for operation in Operation.objects.filter(key__in=[r.operation_key for r in requests])
        .select_related("provider")
        .annotate(latest_evidence=Subquery(_latest_evidence().values("pk")[:1]))
    }
    latest = Evidence.objects.in_bulk(
        [o.latest_evidence for o in operations.values() if o.latest_evidence]
    )
    rows = []
    for request in requests:
        operation = operations.get(request.operation_key)
        if operation is not None:
            evidence = latest.get(operation.latest_evidence)
            rows.append(ProposalRow(request, operation, evidence))
    return rows


def reconciliation_request_for_user(
    *, user: Any, request_id: int
) -> tuple[ReconciliationRequest, Operation] | None:
    """One request and its operation, or None when absent or ``user`` may not view it."""
    request = ReconciliationRequest.objects.filter(pk=request_id).first()
    if request is None:
        return None
    operation = operation_for_user(user=user, key=request.operation_key)
    if operation is None:
        return None
    return request, operation
