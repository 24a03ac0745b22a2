"""One identity type: actors are the same credential, never the same name."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from approvals.models import PermitEvent
from approvals.services.approvals import approval_request
from approvals.services.permits import permit_consume
from common.actors import Actor
from tests.support.approvals import BINDING, HOST, approval_decided

pytestmark = pytest.mark.django_db


def test_a_renamed_user_is_the_same_actor_and_a_namesake_of_another_kind_is_not() -> None:
    alice = User.objects.create_user("alice")
    before = Actor.of("user", alice)
    alice.username = "alice.smith"
    alice.save()
    after = Actor.of("user", alice)
    assert after == before
    assert (str(before), str(after)) == ("user:alice", "user:alice.smith")
    assert Actor("approver", str(alice.pk), "alice") != before


@pytest.mark.parametrize(
    "stored",
    # New rows, then rows written before ids were kept (the audit hash covers this
    # text: what was written must be exactly what verification reads back).
    ["user:7:alice", "approver:12:name:with:colons", "system:manage.py:manage.py", "host:shop"],
)
def test_the_stored_text_reads_back_exactly(stored: str) -> None:
    assert Actor.parse(stored).stored == stored


def test_history_keeps_the_credential_reference_not_a_name() -> None:
    approval, _ = approval_request(binding=BINDING, requested_by=HOST)
    approver = Actor("approver", "41", "alice-phone")
    _, permit = approval_decided(approval, approve=True, by=approver, ttl_seconds=60)
    assert permit is not None
    with transaction.atomic():
        permit_consume(binding=BINDING, presented_digest=BINDING.params_digest, actor=HOST)
        permit_consume(binding=BINDING, presented_digest=BINDING.params_digest, actor=HOST)
    approval.refresh_from_db()
    permit.refresh_from_db()
    refused = PermitEvent.objects.get(kind="refused")
    assert (approval.decided_by.kind, approval.decided_by.id) == ("approver", "41")
    assert (approval.requested_by, permit.consumed_by, refused.actor) == (HOST, HOST, HOST)
    # The column holds the kind and id, and the name as it was, for reading.
    assert approval.decided_by.stored == "approver:41:alice-phone"


def test_an_actor_field_refuses_a_plain_string() -> None:
    approval, _ = approval_request(binding=BINDING, requested_by=HOST)
    approval.decided_by = "approver:alice"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="holds an Actor"):
        approval.save()
