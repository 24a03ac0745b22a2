"""A person signs their decision on an approval with their passkey, on a phone.

Chromium's virtual authenticator (DevTools: ``WebAuthn.addVirtualAuthenticator``) is the
phone's platform authenticator. The approval requires a passkey (its policy said so):
the page's *Sign and approve* has the browser sign Settle's statement, and the vote, its
audit event and verify_audit carry and check that signature. With user verification off
(the passkey not unlocked) nothing is signed and nothing decided.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Approval, ApprovalVote
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from recovery.models import Operation
from tests.support.browser import (
    PHONE,
    assert_no_overflow,
    base64url_of,
    passkey_register_in,
    screenshot,
    sign_in,
)
from tests.support.console import console_user, pending_approval

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def dora(provider):
    return console_user("dora", "decide_approvals", provider)


def test_a_passkey_signs_an_approval_on_a_phone(page: Page, authenticator, flow, dora):
    approval = pending_approval(flow, "pay-1", rule="signed-payments", passkey_required=True)
    page.set_viewport_size(PHONE)
    sign_in(page, "dora")
    passkey_register_in(page, "Phone")
    page.goto(f"/approvals/{approval.pk}/")
    expect(page.get_by_role("button", name="Sign and approve")).to_be_visible()
    assert_no_overflow(page)
    screenshot(page, "approval-sign-light-390")
    page.fill("#id_reason", "checked against the invoice")
    page.get_by_role("button", name="Sign and approve").click()
    expect(page.locator(".notice.success")).to_contain_text("Approved")
    screenshot(page, "approval-signed-light-390")

    assert Approval.objects.get(pk=approval.pk).status == "approved"
    assert Operation.objects.get(key="pay-1").state == "approved"
    vote = ApprovalVote.objects.get(approval_id=approval.pk)
    (credential,) = authenticator.credentials()
    assert vote.signature["credential_id"] == base64url_of(credential["credentialId"])
    assert vote.signature["statement"]["params_digest"] == approval.params_digest
    assert vote.reason == "checked against the invoice"
    event = AuditEvent.objects.get(operation_key="pay-1", kind=AuditKind.APPROVAL_VOTED)
    assert event.data["signature"] == vote.signature
    assert list(audit_verify()) == []


def test_a_passkey_not_unlocked_signs_and_decides_nothing(page: Page, authenticator, flow, dora):
    approval = pending_approval(flow, "pay-1", rule="signed-payments", passkey_required=True)
    page.set_viewport_size(PHONE)
    sign_in(page, "dora")
    passkey_register_in(page, "Phone")
    authenticator.user_verified(False)
    page.goto(f"/approvals/{approval.pk}/")
    page.get_by_role("button", name="Sign and approve").click()
    expect(page.locator("[data-sign-status]")).to_contain_text("NotAllowedError")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not ApprovalVote.objects.exists()
    # An unsigned decision is refused where the policy requires a passkey: no such button.
    expect(page.get_by_role("button", name="Approve", exact=True)).to_have_count(0)


def test_a_person_without_a_passkey_is_told_how_to_register_one(page: Page, flow, dora):
    approval = pending_approval(flow, "pay-1", rule="signed-payments", passkey_required=True)
    page.set_viewport_size(PHONE)
    sign_in(page, "dora")
    page.goto(f"/approvals/{approval.pk}/")
    expect(page.get_by_role("link", name="Register a passkey")).to_be_visible()
    screenshot(page, "approval-no-passkey-light-390")
