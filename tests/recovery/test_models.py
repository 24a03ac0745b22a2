"""Small rules the models hold: when a lease is alive, and which dispatch is an operation's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.models import Dispatch, LookupAttempt, Operation

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("model", [Dispatch, LookupAttempt])
def test_a_lease_is_alive_until_its_expiry_and_lapsed_at_it(model):
    now = timezone.now()
    leased = model(lease_expires_at=now)
    assert leased.lease_alive(now - timedelta(microseconds=1))
    assert not leased.lease_alive(now)
    assert not leased.lease_alive(now + timedelta(seconds=1))


def test_an_operations_dispatch_is_none_before_it_is_dispatched(flow):
    flow.approved("op-1")
    assert Dispatch.of(Operation.objects.get(key="op-1")) is None


def test_an_operations_dispatch_is_read_afresh_not_from_the_accessors_cache(flow):
    flow.approved("op-1")
    assert flow.dispatch("op-1").status_code == 200
    operation = Operation.objects.get(key="op-1")
    cached = operation.dispatch  # the reverse accessor caches what it read
    Dispatch.objects.filter(pk=cached.pk).update(receipt_status=Dispatch.ReceiptStatus.FAILED)
    assert operation.dispatch.receipt_status == Dispatch.ReceiptStatus.RUNNING
    fresh = Dispatch.of(operation)
    assert fresh is not None and fresh.receipt_status == Dispatch.ReceiptStatus.FAILED
