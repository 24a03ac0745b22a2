"""Settle sends a customer their approval link through Apprise, only to a contact the
operator allows, after the opening commits; a real local receiver takes it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from approvals.models import Approval
from common.links import approval_link_url
from recovery.services.customers import party_link_send
from tests.support.apprise_receiver import Receiver, receiver_serve
from tests.support.customers import PARTY, customer_open, customer_policy_apply


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from receiver_serve()


@pytest.fixture
def allowed(settings, receiver):
    settings.SETTLE_PARTY_NOTIFY_SCHEMES = ("json",)
    settings.SETTLE_PARTY_NOTIFY_HOSTS = ("127.0.0.1",)
    settings.SETTLE_PARTY_NOTIFY_ALLOW_PRIVATE = True
    customer_policy_apply()


def _contact(receiver: Receiver) -> dict[str, str]:
    return {**PARTY, "contact": f"json://127.0.0.1:{receiver.port}/party"}


def test_the_link_goes_to_the_partys_contact_once_the_opening_committed(
    flow, allowed, receiver, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as published:
        opened = customer_open(flow, party=_contact(receiver))
    assert any("party_link_publish" in repr(callback) for callback in published)
    assert party_link_send(approval_id=opened["approval_id"])
    (post,) = receiver.take()
    assert approval_link_url(opened["approval_id"]) in post["message"]
    assert post["title"] == "fleet-a asks for your approval"


def test_a_private_address_is_refused_unless_the_operator_allows_it(
    flow, allowed, receiver, settings
):
    opened = customer_open(flow, party=_contact(receiver))
    settings.SETTLE_PARTY_NOTIFY_ALLOW_PRIVATE = False
    assert not party_link_send(approval_id=opened["approval_id"])
    assert receiver.take() == []


def test_a_contact_the_settings_no_longer_allow_gets_nothing(flow, allowed, receiver, settings):
    opened = customer_open(flow, party=_contact(receiver))
    settings.SETTLE_PARTY_NOTIFY_HOSTS = ()
    assert not party_link_send(approval_id=opened["approval_id"])
    assert receiver.take() == []


def test_a_decided_approval_sends_nothing(flow, allowed, receiver):
    opened = customer_open(flow, party=_contact(receiver))
    Approval.objects.filter(pk=opened["approval_id"]).update(status="cancelled")
    assert not party_link_send(approval_id=opened["approval_id"])
    assert receiver.take() == []


def test_without_a_contact_nothing_is_queued(flow, allowed, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as published:
        customer_open(flow)
    assert not any("party_link_publish" in repr(callback) for callback in published)
