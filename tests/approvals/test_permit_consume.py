"""Permits on their own: issued by one approval, consumed once, for one exact action."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import DateTimeField
from django.utils import timezone

from approvals.models import Approval, Permit, PermitEvent
from approvals.selectors import permit_history
from approvals.services.approvals import Binding, approval_request, approval_resolve
from approvals.services.errors import ApprovalError, Refusal
from approvals.services.permits import permit_consume, permit_mark_revoked
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from dbsql.clock import Clock
from tests.support.approvals import BINDING, HOST, approval_decided

pytestmark = pytest.mark.django_db

ALICE = Actor("approver", "1", "alice")
BOB = Actor("approver", "2", "bob")


def _permit(ttl_seconds: int = 300) -> Permit:
    approval, created = approval_request(binding=BINDING, requested_by=HOST)
    assert created
    _, permit = approval_decided(approval, approve=True, by=ALICE, ttl_seconds=ttl_seconds)
    assert permit is not None
    return permit


def _consume(binding: Binding = BINDING, digest: str | None = None):
    with transaction.atomic():
        return permit_consume(
            binding=binding, presented_digest=digest or binding.params_digest, actor=HOST
        )


def test_permit_is_consumed_once_and_then_refused_as_already_consumed():
    permit = _permit()
    assert _consume().consumed
    again = _consume()
    assert again.refusal == Refusal.ALREADY_CONSUMED
    permit.refresh_from_db()
    history = [(line["kind"], line["reason"]) for line in permit_history(permit)]
    assert history == [("issued", ""), ("consumed", ""), ("refused", "already_consumed")]
    assert permit.consumed_by == HOST


def test_a_permit_riding_with_the_events_is_written_with_them_and_never_consumed_before():
    """A decision on its own lets its permit's INSERT ride with the transaction's events
    (``permit_write`` riding): consuming it before they are written is a mistake said loudly,
    never a refusal of a permit that exists; once they are, it is there, and consumed."""
    approval, _ = approval_request(binding=BINDING, requested_by=HOST)
    with audit_transaction():
        audit_append(kind=AuditKind.PERMIT_ISSUED, actor=ALICE, data={})
        _, permit = approval_resolve(
            approval_id=approval.pk,
            binding=BINDING,
            approve=True,
            decided_by=ALICE,
            ttl_seconds=300,
            permit_write="riding",
        )
        assert permit is not None
        with pytest.raises(RuntimeError, match="rides with this transaction's events"):
            permit_consume(binding=BINDING, presented_digest=BINDING.params_digest, actor=HOST)
    assert Permit.objects.get().pk == permit.pk
    assert _consume().consumed


@pytest.mark.parametrize("field", ["action", "provider", "params_digest"])
def test_any_difference_in_the_action_is_refused_as_action_mismatch(field):
    _permit()
    other = dataclasses.replace(BINDING, **{field: "sha256:" + "b" * 64})
    result = _consume(other, digest=BINDING.params_digest)
    assert result.refusal == Refusal.ACTION_MISMATCH
    assert Permit.objects.get().status == "active"


def test_a_presented_digest_that_differs_is_refused():
    _permit()
    assert _consume(digest="sha256:" + "c" * 64).refusal == Refusal.ACTION_MISMATCH


def test_no_permit_for_the_key_is_not_authorized():
    assert _consume().refusal == Refusal.NOT_AUTHORIZED


def test_permit_past_its_expiry_by_the_database_clock_is_refused():
    permit = _permit()
    now = timezone.now()
    Permit.objects.filter(pk=permit.pk).update(
        issued_at=now - timedelta(minutes=5), expires_at=now - timedelta(milliseconds=1)
    )
    assert _consume().refusal == Refusal.EXPIRED
    assert Permit.objects.get().status == "expired"


def test_revoking_an_active_permit_prevents_consumption():
    permit = _permit()
    assert permit_mark_revoked(permit=permit, reason="changed mind", actor=ALICE) is True
    assert _consume().refusal == Refusal.REVOKED


def test_revoking_a_consumed_permit_changes_nothing_but_is_recorded():
    permit = _permit()
    _consume()
    assert permit_mark_revoked(permit=permit, reason="too late", actor=ALICE) is False
    permit.refresh_from_db()
    assert (permit.status, permit.revoked_at) == ("consumed", None)
    assert PermitEvent.objects.filter(permit=permit, kind="revoke_ignored").count() == 1


def test_an_approval_is_decided_once():
    approval, _ = approval_request(binding=BINDING, requested_by=HOST)
    approval_decided(approval, approve=False, by=ALICE, ttl_seconds=60)
    with pytest.raises(ApprovalError) as error:
        approval_decided(approval, approve=True, by=BOB, ttl_seconds=60)
    assert error.value.code == "already_decided"
    assert not Permit.objects.exists()
    assert Approval.objects.get().status == "denied"


@pytest.mark.parametrize("ttl", [0, -1, 7 * 24 * 3600 + 1])
def test_ttl_outside_the_allowed_range_is_refused(ttl):
    approval, _ = approval_request(binding=BINDING, requested_by=HOST)
    with pytest.raises(ApprovalError):
        approval_decided(approval, approve=True, by=ALICE, ttl_seconds=ttl)
    assert Approval.objects.get().status == "pending"


def test_a_second_request_returns_the_pending_approval():
    first, _ = approval_request(binding=BINDING, requested_by=HOST)
    second, created = approval_request(binding=BINDING, requested_by=HOST)
    assert (second.pk, created) == (first.pk, False)


def test_an_ignored_revocation_is_written_at_the_databases_clock(monkeypatch):
    # Every line of a permit's history that judges nothing new is timed as the
    # judgements are: by the database's clock (``dbsql.clock``), which this stands for.
    permit = _permit()
    _consume()
    database_says = timezone.now() - timedelta(minutes=7)
    param = DateTimeField().get_db_prep_value(database_says, connection)
    monkeypatch.setattr("dbsql.clock.clock", lambda: Clock("%s", (param,), database_says))
    permit_mark_revoked(permit=permit, reason="too late", actor=ALICE)
    assert PermitEvent.objects.get(permit=permit, kind="revoke_ignored").at == database_says
