"""A second operator signs a four-eyes decision with their passkey, on a phone: a
reconciliation request from the requests page, and the rejection of a bulk batch from
its page (the one posted to a URL of its own).

Chromium's virtual authenticator is the phone's platform authenticator; the decision
keeps the signature and ``verify_audit`` checks it.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from approvals.models import ReconciliationRequest
from audit.verify_walk import audit_verify
from bulk.services import Pick, bulk_submit
from common.actors import Actor
from recovery.models import Operation
from recovery.services.reconcile import operation_reconcile
from tests.support.browser import (
    PHONE,
    assert_no_overflow,
    base64url_of,
    passkey_register_in,
    screenshot,
    sign_in,
)
from tests.support.console import console_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sue(provider):
    return console_user("sue", "supervisor", provider)


def test_a_passkey_signs_the_approval_of_a_proposed_void(
    page: Page, authenticator, stuck, operator, sue
):
    operation = stuck.mismatch("op-1")
    operation_reconcile(
        operation=operation,
        action="void",
        version=operation.version,
        reason="customer cancelled by phone",
        actor=Actor.of("user", operator),
    )
    page.set_viewport_size(PHONE)
    sign_in(page, "sue")
    passkey_register_in(page, "Phone")
    page.goto("/reconciliations/")
    expect(page.get_by_role("button", name="Sign and approve void")).to_be_visible()
    assert_no_overflow(page)
    screenshot(page, "reconciliation-sign-light-390")
    page.get_by_role("button", name="Sign and approve void").click()
    # The reason is asked for before the passkey.
    expect(page.locator("[data-sign-status]")).to_be_empty()
    page.get_by_label("Reason").fill("confirmed with the customer")
    page.get_by_role("button", name="Sign and approve void").click()
    expect(page.locator(".notice.success")).to_contain_text("Approved and done")

    request = ReconciliationRequest.objects.get()
    (credential,) = authenticator.credentials()
    assert request.status == "approved"
    assert request.signature["credential_id"] == base64url_of(credential["credentialId"])
    assert Operation.objects.get(key="op-1").state == "voided"
    assert list(audit_verify()) == []


def test_a_passkey_signs_the_rejection_of_a_void_batch(
    page: Page, authenticator, stuck, provider, sue
):
    proposer = console_user("sam", "supervisor", provider)
    operations = [stuck.mismatch(f"x-{n}") for n in range(2)]
    batch = bulk_submit(
        action="void",
        picks=[Pick(op.pk, op.version) for op in operations],
        selection="picked by hand",
        reason="provider lost these",
        actor=Actor.of("user", proposer),
    )
    page.set_viewport_size(PHONE)
    sign_in(page, "sue")
    passkey_register_in(page, "Phone")
    page.goto(f"/batches/{batch.pk}/")
    page.get_by_label("Reason").fill("not before the provider answers")
    assert_no_overflow(page)
    screenshot(page, "bulk-sign-light-390")
    page.get_by_role("button", name="Sign and reject").click()
    expect(page.locator(".notice.success")).to_contain_text("Rejected")

    batch.refresh_from_db()
    assert batch.status == "rejected"
    assert batch.signature["statement"]["decision"] == "reject"
    assert set(Operation.objects.values_list("state", flat=True)) == {"reconcile"}
    assert list(audit_verify()) == []
