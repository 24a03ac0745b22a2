"""The approval link's page: reading never decides, deciding is a POST from the page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Approval, ApprovalVote
from audit.models import AuditEvent
from common.links import approval_link_token
from customers.pages import CONTENT_SECURITY_POLICY
from recovery.models import Host, Operation
from tests.support.customers import Page, customer_open, customer_policy_apply


@pytest.fixture
def policy(db):
    customer_policy_apply()


@pytest.fixture
def opened(flow, policy):
    return customer_open(flow)


def _unchanged(approval_id):
    approval = Approval.objects.get(pk=approval_id)
    return approval.status == "pending" and not ApprovalVote.objects.exists()


def _safe(response):
    assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert response["Cache-Control"] == "no-store"
    assert response["Referrer-Policy"] == "no-referrer"


def test_the_page_reads_no_token_and_carries_no_inline_script_or_style(opened):
    response = Client().get("/approve/")
    assert response.status_code == 200
    _safe(response)
    html = response.content.decode()
    assert "<script>" not in html and "style=" not in html and "<style" not in html
    assert "http://" not in html.replace('xmlns="http://', "") and "https://" not in html


@pytest.mark.parametrize("query", ["", "?token={token}", "?t={token}&decision=approve"])
def test_an_unfurlers_get_changes_nothing(opened, query):
    token = approval_link_token(opened["approval_id"])
    for path in ("/approve/", "/approve/state", "/approve/decide"):
        response = Client().get(path + query.format(token=token), HTTP_USER_AGENT="Slackbot")
        assert response.status_code in (200, 405)
        _safe(response)
    assert _unchanged(opened["approval_id"])


def test_the_page_shows_who_asks_the_action_in_plain_words_and_the_digest(opened):
    Host.objects.filter(name="fleet-a").update(display_name="Acme Payments")
    response = Page(opened["approval_id"]).state()
    assert response.status_code == 200
    _safe(response)
    html = response.content.decode()
    assert "Acme Payments asks for your approval" in html
    assert "Pay €1,250.00 to acct-7" in html
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    assert digest in html and 'data-stage="pending"' in html
    assert 'data-decision="approve"' in html and 'data-decision="deny"' in html


def test_approve_by_link_then_the_page_says_what_happens_next(opened):
    page = Page(opened["approval_id"])
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    response = page.decide("approve", digest)
    assert response.status_code == 200, response.content
    _safe(response)
    assert 'data-outcome="approved"' in response.content.decode()
    assert Operation.objects.get(key="op-1").state == "approved"
    permit = Approval.objects.get(pk=opened["approval_id"]).permit
    assert permit.expires_at - permit.issued_at == timedelta(minutes=10)  # the rule's


def test_decline_with_a_reason(opened):
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    response = Page(opened["approval_id"]).decide("deny", digest, reason="Not me")
    assert 'data-outcome="denied"' in response.content.decode()
    approval = Approval.objects.get(pk=opened["approval_id"])
    assert approval.status == "denied" and approval.decision_reason == "Not me"


def test_a_decision_without_the_pages_csrf_token_is_refused(opened):
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    client = Client(enforce_csrf_checks=True)
    token = approval_link_token(opened["approval_id"])
    fields = {"token": token, "decision": "approve", "params_digest": digest}
    response = client.post("/approve/decide", fields)
    assert response.status_code == 403
    assert 'data-code="csrf_failed"' in response.content.decode()
    _safe(response)
    assert _unchanged(opened["approval_id"])


def test_two_tabs_one_decision_the_other_told_it_was_decided(opened):
    first, second = Page(opened["approval_id"]), Page(opened["approval_id"])
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    assert first.decide("approve", digest).status_code == 200
    late = second.decide("deny", digest)
    assert late.status_code == 409
    assert 'data-code="already_decided"' in late.content.decode()
    assert Approval.objects.get(pk=opened["approval_id"]).status == "approved"
    assert second.state().content.decode().count('data-outcome="approved"') == 1


def test_a_used_link_says_so_and_decides_nothing(opened):
    page = Page(opened["approval_id"])
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    page.decide("deny", digest)
    assert 'data-outcome="denied"' in page.state().content.decode()
    again = page.decide("approve", digest)
    assert 'data-code="already_decided"' in again.content.decode()
    assert Approval.objects.get(pk=opened["approval_id"]).status == "denied"


def test_an_expired_link_says_so_decides_nothing_and_is_recorded(opened):
    page = Page(opened["approval_id"])
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    # Past its time by the database's clock, which judges expiry; the sweep not yet by.
    Approval.objects.filter(pk=opened["approval_id"]).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )
    assert 'data-stage="expired"' in page.state().content.decode()
    late = page.decide("approve", digest)
    assert late.status_code == 409 and 'data-code="approval_expired"' in late.content.decode()
    assert not ApprovalVote.objects.exists()
    assert Approval.objects.get(pk=opened["approval_id"]).status == "expired"
    refused = AuditEvent.objects.get(kind="decision_refused")
    assert refused.data["code"] == "approval_expired" and refused.actor.kind == "party"


def test_a_bad_token_is_refused_with_its_code(opened):
    page = Page(opened["approval_id"])
    page.token = page.token[:-2] + ("AA" if page.token[-2:] != "AA" else "BB")
    response = page.state()
    assert response.status_code == 404 and 'data-code="link_invalid"' in response.content.decode()
    _safe(response)


def test_a_digest_other_than_the_one_shown_decides_nothing(opened):
    page = Page(opened["approval_id"])
    response = page.decide("approve", "sha256:" + "0" * 64)
    assert 'data-code="digest_mismatch"' in response.content.decode()
    assert _unchanged(opened["approval_id"])


def test_too_many_tries_from_one_address_are_refused(opened, settings):
    settings.SETTLE_LINK_TRIES_PER_MINUTE = 3
    page = Page(opened["approval_id"])
    assert [page.state().status_code for _ in range(3)] == [200, 200, 200]
    refused = page.state()
    assert refused.status_code == 429
    assert 'data-code="link_rate_limited"' in refused.content.decode()
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    assert page.decide("approve", digest).status_code == 429
    assert _unchanged(opened["approval_id"])
    other = Page(opened["approval_id"], REMOTE_ADDR="10.0.0.9")
    assert other.state().status_code == 200


def test_the_page_speaks_the_browsers_language(opened):
    page = Page(opened["approval_id"], HTTP_ACCEPT_LANGUAGE="de-DE,de;q=0.9,en;q=0.5")
    assert page.opened["Content-Language"] == "de"
    html = page.state().content.decode()
    assert "bittet um Ihre Zustimmung" in html and "Ablehnen" in html
    assert "1.250,00" in html  # the summary's money in the customer's locale


def test_a_swept_expired_link_says_expired_not_decided(opened):
    page = Page(opened["approval_id"])
    digest = Approval.objects.get(pk=opened["approval_id"]).params_digest
    Approval.objects.filter(pk=opened["approval_id"]).update(status="expired")
    late = page.decide("approve", digest)
    assert 'data-code="approval_expired"' in late.content.decode()
