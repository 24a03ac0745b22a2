"""Permits as the approvals tests make them: one host, one binding, and an approval
decided for it."""

from __future__ import annotations

from approvals.models import Approval
from approvals.services.approvals import Binding, approval_resolve
from common.actors import Actor

HOST = Actor("host", "1", "a")
BINDING = Binding(
    operation_key="op-1",
    action="payment.send",
    provider="orders",
    params_digest="sha256:" + "a" * 64,
)


def approval_decided(approval: Approval, *, approve: bool, by: str, ttl_seconds: int):
    return approval_resolve(
        approval_id=approval.pk,
        binding=BINDING,
        approve=approve,
        decided_by=by,
        ttl_seconds=ttl_seconds,
    )
