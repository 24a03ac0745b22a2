"""Confirm, void, repair: at once where the evidence backs it, four eyes where it does not.

Every operation here reaches its state through the host API and the provider's own
record, as in production; only the stranded receipts of settled operations, which no
path of today's code leaves behind, are made by writing the receipt back to ``running``.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.models import ReconciliationRequest
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import sqlite_provider_commit
from recovery.models import Dispatch, Operation, OperationClaim, Provider
from tests.support.console import client_for, console_user
from tests.support.flow import PARAMS, lookup_due

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_operator(provider: Provider) -> User:
    return console_user("otto", "operator", provider)


def _act(client: Client, operation: Operation, action: str, *, version=None, reason="checked"):
    """The decision as its final submit sends it (a void's from its confirmation page)."""
    data = {"version": operation.version if version is None else version, "reason": reason}
    if action == "void":
        data["confirmed"] = "on"
    return client.post(f"/operations/{operation.key}/{action}", data, follow=True)


def _decide(client: Client, request: ReconciliationRequest, decision: str, reason="agreed"):
    return client.post(f"/reconciliations/{request.pk}/{decision}", {"reason": reason}, follow=True)


def _events(operation: Operation, kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(operation_key=operation.key, kind=kind))


def _refused(operation: Operation) -> list[tuple[str, str]]:
    return [(e.data["action"], e.data["code"]) for e in _events(operation, "operator_refused")]


def _fresh(operation: Operation) -> Operation:
    return Operation.objects.select_related("dispatch").get(pk=operation.pk)


# -- backed by the evidence: done at once --------------------------------------------------


def test_confirm_on_matching_evidence_releases_at_once(operator, stuck, provider_db):
    operation = stuck.conflict("op-1", host_says="failed", provider_says="committed")
    page = _act(client_for(operator), operation, "confirm", reason="provider shows it done")
    after = _fresh(operation)
    assert after.state == "released"
    assert "Confirmed: the operation is released." in page.content.decode()
    [action] = _events(operation, "operator_action")
    assert action.data["action"] == "confirm"
    assert action.data["reason"] == "provider shows it done"
    transition = _events(operation, "transition")[-1]
    assert transition.data["event"] == "confirm"
    assert transition.data["evidence_id"] == action.data["evidence_id"]
    # The host's own report is its record; confirming does not rewrite it.
    assert after.dispatch.receipt_status == "failed"
    assert not ReconciliationRequest.objects.exists()


def test_void_is_refused_outright_when_the_evidence_matches_a_committed_effect(
    supervisor, stuck, provider_db
):
    operation = stuck.conflict("op-1", host_says="failed", provider_says="committed")
    page = _act(client_for(supervisor), operation, "void")
    assert "it happened, so it cannot be voided" in page.content.decode()
    assert _fresh(operation).state == "reconcile"
    assert _refused(operation) == [("void", "evidence_matches")]
    assert not ReconciliationRequest.objects.exists()


def test_void_on_the_providers_failed_record_is_done_at_once(operator, stuck, provider_db):
    operation = stuck.conflict("op-1", host_says="committed", provider_says="failed")
    _act(client_for(operator), operation, "void")
    assert _fresh(operation).state == "voided"
    assert not ReconciliationRequest.objects.exists()


def test_void_on_absence_needs_four_eyes_unless_the_provider_is_authoritative(
    operator, stuck, provider
):
    first = stuck.unknown("op-1")  # the provider has no record: evidence "absent"
    _act(client_for(operator), first, "void")
    assert _fresh(first).state == "unknown"
    assert ReconciliationRequest.objects.get().action == "void"

    Provider.objects.filter(pk=provider.pk).update(absent_is_authoritative=True)
    second = stuck.unknown("op-2")
    _act(client_for(operator), second, "void")
    after = _fresh(second)
    assert after.state == "voided"
    # The stranded receipt is completed as failed, from the evidence that backed the void.
    assert after.dispatch.receipt_status == "failed"
    assert after.dispatch.receipt_recovered
    assert after.dispatch.receipt_evidence.verdict == "absent"
    [recovered] = _events(second, "receipt_recovered")
    assert recovered.data == {"evidence_id": after.dispatch.receipt_evidence_id, "status": "failed"}


def test_four_eyes_on_absence_follow_the_provider_as_it_was_when_the_evidence_was_captured(
    operator, stuck, provider
):
    unbacked = stuck.unknown("op-1")  # captured while the provider's absence is not authoritative
    Provider.objects.filter(pk=provider.pk).update(absent_is_authoritative=True)
    backed = stuck.unknown("op-2")  # captured while it is
    # Turning the flag on for a moment does not make the earlier absence back a void...
    _act(client_for(operator), unbacked, "void")
    assert _fresh(unbacked).state == "unknown"
    assert ReconciliationRequest.objects.get().operation_key == "op-1"
    # ...nor does turning it off again take back what the later one backs.
    Provider.objects.filter(pk=provider.pk).update(absent_is_authoritative=False)
    _act(client_for(operator), backed, "void")
    assert _fresh(backed).state == "voided"
    assert ReconciliationRequest.objects.count() == 1


# -- four eyes --------------------------------------------------------------------------


def test_a_proposed_void_is_approved_by_a_supervisor_in_one_step(operator, supervisor, stuck):
    operation = stuck.mismatch("op-1")
    page = _act(client_for(operator), operation, "void", reason="customer cancelled by phone")
    assert "waits for a second operator" in page.content.decode()
    proposal = ReconciliationRequest.objects.get()
    assert (proposal.status, proposal.action, proposal.operation_version) == (
        "pending",
        "void",
        operation.version,
    )
    assert proposal.proposed_by.id == str(operator.pk)
    assert _fresh(operation).state == "reconcile"

    listed = client_for(supervisor).get("/reconciliations/").content.decode()
    assert "customer cancelled by phone" in listed and "Approve void" in listed

    _decide(client_for(supervisor), proposal, "approve", reason="confirmed with the customer")
    after = _fresh(operation)
    proposal.refresh_from_db()
    assert after.state == "voided"
    assert proposal.status == "approved" and proposal.decided_by.id == str(supervisor.pk)
    assert after.dispatch.receipt_status == "failed"
    assert after.dispatch.receipt_request_id == proposal.pk
    assert after.dispatch.receipt_evidence_id is None
    [approved] = _events(operation, "reconciliation_approved")
    assert approved.data["proposed_by"] == f"user:{operator.get_username()}"
    assert _events(operation, "transition")[-1].data["request_id"] == proposal.pk
    timeline = client_for(operator).get(f"/operations/{operation.key}/").content.decode()
    assert "Proposed void for a second operator: “customer cancelled by phone”" in timeline
    assert "Proposed void approved: “confirmed with the customer”" in timeline
    assert f"Receipt completed from four-eyes request #{proposal.pk}: failed" in timeline


def test_the_proposer_can_never_approve_their_own_request(supervisor, stuck):
    operation = stuck.mismatch("op-1")
    client = client_for(supervisor)  # holds approve_reconciliations, and proposes
    _act(client, operation, "confirm")
    proposal = ReconciliationRequest.objects.get()
    page = _decide(client, proposal, "approve")
    assert "you proposed this one" in page.content.decode()
    proposal.refresh_from_db()
    assert proposal.status == "pending"
    assert _fresh(operation).state == "reconcile"
    assert _refused(operation) == [("approve", "self_approval")]
    assert "cannot approve your own proposal" in client.get("/reconciliations/").content.decode()


def test_a_request_is_invalidated_when_new_evidence_arrives_before_approval(
    operator, supervisor, stuck
):
    operation = stuck.unknown("op-1")
    _act(client_for(operator), operation, "confirm", reason="worker log says done")
    proposal = ReconciliationRequest.objects.get()
    lookup_due("op-1")
    assert stuck.flow.resume_looked_up("op-1")["state"] == "unknown"  # another absent: new evidence
    page = _decide(client_for(supervisor), proposal, "approve")
    assert "new evidence arrived since it was proposed" in page.content.decode()
    proposal.refresh_from_db()
    assert proposal.status == "invalidated"
    assert _fresh(operation).state == "unknown"
    assert len(_events(operation, "reconciliation_invalidated")) == 1


def test_a_request_is_invalidated_when_the_operation_moved_on(
    operator, supervisor, stuck, provider_db
):
    operation = stuck.unknown("op-1")
    _act(client_for(operator), operation, "void")
    proposal = ReconciliationRequest.objects.get()
    sqlite_provider_commit(provider_db, operation_key="op-1", params=PARAMS, reference="r-1")
    lookup_due("op-1")
    assert stuck.flow.resume_looked_up("op-1")["state"] == "released"
    _decide(client_for(supervisor), proposal, "approve")
    proposal.refresh_from_db()
    assert proposal.status == "invalidated"
    assert "moved on" in proposal.decision_reason
    assert _fresh(operation).state == "released"


def test_a_confirm_approved_by_four_eyes_completes_the_stranded_receipt(
    operator, supervisor, stuck
):
    operation = stuck.unknown("op-1")
    _act(client_for(operator), operation, "confirm")
    proposal = ReconciliationRequest.objects.get()
    _decide(client_for(supervisor), proposal, "approve")
    after = _fresh(operation)
    assert after.state == "released"
    assert (after.dispatch.receipt_status, after.dispatch.receipt_request_id) == (
        "succeeded",
        proposal.pk,
    )


def test_a_rejected_request_changes_nothing_else(operator, supervisor, stuck):
    operation = stuck.mismatch("op-1")
    _act(client_for(operator), operation, "void")
    proposal = ReconciliationRequest.objects.get()
    _decide(client_for(supervisor), proposal, "reject", reason="the record is ours, not theirs")
    proposal.refresh_from_db()
    assert proposal.status == "rejected"
    assert proposal.decision_reason == "the record is ours, not theirs"
    assert _fresh(operation).state == "reconcile"
    # and a decided request cannot be decided again
    _decide(client_for(supervisor), proposal, "approve")
    assert _refused(operation) == [("approve", "already_decided")]


def test_one_pending_request_per_operation(operator, second_operator, stuck):
    operation = stuck.mismatch("op-1")
    _act(client_for(operator), operation, "void")
    page = _act(client_for(second_operator), operation, "confirm")
    assert "already waits for approval" in page.content.decode()
    assert ReconciliationRequest.objects.count() == 1
    assert _refused(operation) == [("confirm", "request_pending")]


# -- repairing a stranded receipt -------------------------------------------------------


def _strand(operation: Operation) -> None:
    Dispatch.objects.filter(operation=operation).update(
        receipt_status="running", receipt_recovered=False, receipt_evidence=None
    )


def test_repair_from_matching_evidence_is_done_at_once(operator, stuck):
    operation = stuck.released("op-1")
    _strand(operation)
    _act(client_for(operator), operation, "repair")
    after = _fresh(operation)
    assert (after.state, after.version) == ("released", operation.version)
    assert after.dispatch.receipt_status == "succeeded"
    assert after.dispatch.receipt_evidence.verdict == "match"
    # Repairing it again finds nothing stranded.
    _act(client_for(operator), operation, "repair")
    assert _refused(operation) == [("repair", "not_stranded")]


def test_repair_without_evidence_goes_through_four_eyes(operator, supervisor, stuck):
    operation = stuck.unknown("op-1")  # absent, and the provider's absence is not authoritative
    _act(client_for(operator), operation, "void")
    _decide(client_for(supervisor), ReconciliationRequest.objects.get(), "approve")
    voided = _fresh(operation)
    assert voided.state == "voided"
    _strand(voided)
    _act(client_for(operator), voided, "repair")
    proposal = ReconciliationRequest.objects.get(action="repair")
    assert proposal.action == "repair"
    assert _fresh(operation).dispatch.receipt_status == "running"
    _decide(client_for(supervisor), proposal, "approve")
    after = _fresh(operation)
    assert (after.dispatch.receipt_status, after.dispatch.receipt_request_id) == (
        "failed",
        proposal.pk,
    )


# -- claims -------------------------------------------------------------------------------


def test_a_claim_keeps_other_operators_off_until_released_or_idle(
    operator, second_operator, stuck, settings
):
    # They come back once the claim has lapsed, still signed in: idle no longer than this.
    settings.SETTLE_SESSION_IDLE_MINUTES = settings.SETTLE_CLAIM_IDLE_MINUTES + 60
    operation = stuck.mismatch("op-1")
    mine, theirs = client_for(operator), client_for(second_operator)
    mine.post(f"/operations/{operation.key}/claim")
    assert OperationClaim.objects.get().actor.id == str(operator.pk)
    assert (
        "Claimed by <strong>olivia</strong>"
        in theirs.get(f"/operations/{operation.key}/").content.decode()
    )

    page = _act(theirs, operation, "void")
    assert "olivia is working on it" in page.content.decode()
    assert _refused(operation) == [("void", "claimed")]
    theirs.post(f"/operations/{operation.key}/release")  # not theirs to release
    theirs.post(f"/operations/{operation.key}/claim")  # nor to take over
    assert OperationClaim.objects.get().actor.id == str(operator.pk)
    # Refused claims and releases are on the record like every other refused action.
    assert _refused(operation) == [
        ("void", "claimed"),
        ("release", "claimed"),
        ("claim", "claimed"),
    ]

    later = timezone.now() + timedelta(minutes=settings.SETTLE_CLAIM_IDLE_MINUTES + 1)
    with time_machine.travel(later):
        _act(theirs, operation, "void")  # the claim lapsed: now they may propose
        assert ReconciliationRequest.objects.filter(action="void").exists()

    mine.post(f"/operations/{operation.key}/release")
    assert not OperationClaim.objects.exists()
    mine.post(f"/operations/{operation.key}/release")  # nothing left to release
    assert _refused(operation)[-1] == ("release", "not_claimed")
    assert [e.kind for e in AuditEvent.objects.filter(kind__in=("claimed", "claim_released"))] == [
        "claimed",
        "claim_released",
    ]


def test_the_claimants_own_actions_keep_the_claim_alive(operator, second_operator, stuck, settings):
    # The other operator comes back after the claim's idle time, still signed in.
    settings.SETTLE_SESSION_IDLE_MINUTES = settings.SETTLE_CLAIM_IDLE_MINUTES * 2
    operation = stuck.unknown("op-1")
    mine, theirs = client_for(operator), client_for(second_operator)
    mine.post(f"/operations/{operation.key}/claim")
    idle = timedelta(minutes=settings.SETTLE_CLAIM_IDLE_MINUTES)
    with time_machine.travel(timezone.now() + idle * 0.8):
        mine.post(
            f"/operations/{operation.key}/lookup", {"version": operation.version, "reason": "x"}
        )
    with time_machine.travel(timezone.now() + idle * 1.5):
        refreshed = _fresh(operation)
        page = _act(theirs, refreshed, "void")
        assert "olivia is working on it" in page.content.decode()


# -- who may do what ------------------------------------------------------------------------

ACTIONS = ["confirm", "void", "repair", "claim", "release"]


@pytest.mark.parametrize("action", ACTIONS)
def test_a_viewer_is_refused_every_action_and_the_refusal_is_recorded(viewer, stuck, action):
    operation = stuck.mismatch("op-1")
    response = client_for(viewer).post(
        f"/operations/{operation.key}/{action}", {"version": operation.version, "reason": "x"}
    )
    assert response.status_code == 403
    assert _refused(operation) == [(action, "forbidden")]
    assert _fresh(operation).version == operation.version


@pytest.mark.parametrize("action", ["confirm", "void", "repair"])
def test_a_viewer_who_gives_no_reason_is_still_refused_and_recorded(
    viewer, outsider, stuck, action
):
    operation = stuck.mismatch("op-1")
    url = f"/operations/{operation.key}/{action}"
    assert client_for(viewer).post(url, {"version": operation.version}).status_code == 403
    assert client_for(outsider).post(url, {"version": operation.version}).status_code == 404
    assert _refused(operation) == [(action, "forbidden")]


@pytest.mark.parametrize("action", ACTIONS)
def test_another_providers_operator_gets_404_for_every_action(outsider, stuck, action):
    operation = stuck.mismatch("op-1")
    response = client_for(outsider).post(
        f"/operations/{operation.key}/{action}", {"version": operation.version, "reason": "x"}
    )
    assert response.status_code == 404
    assert not _refused(operation)


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_need_sign_in_post_and_csrf(operator, stuck, action):
    operation = stuck.mismatch("op-1")
    url = f"/operations/{operation.key}/{action}"
    anonymous = Client().post(url, {"version": operation.version, "reason": "x"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client_for(operator).get(url).status_code == 405
    no_token = client_for(operator, csrf_checks=True).post(url, {"version": 1, "reason": "x"})
    assert no_token.status_code == 403
    assert _fresh(operation).version == operation.version
    assert not OperationClaim.objects.exists() and not ReconciliationRequest.objects.exists()


@pytest.mark.parametrize("action", ["confirm", "void"])
def test_a_decision_from_a_stale_page_is_refused_and_changes_nothing(operator, stuck, action):
    operation = stuck.mismatch("op-1")
    page = _act(client_for(operator), operation, action, version=operation.version - 1)
    assert "(you saw version" in page.content.decode()
    assert _refused(operation) == [(action, "stale_version")]
    assert not ReconciliationRequest.objects.exists()
    assert _fresh(operation).version == operation.version


@pytest.mark.parametrize("action", ["confirm", "void", "repair"])
def test_a_decision_needs_a_reason(operator, stuck, action):
    operation = stuck.mismatch("op-1")
    page = _act(client_for(operator), operation, action, reason="  ")
    assert f"give a reason to {action}" in page.content.decode()
    assert not ReconciliationRequest.objects.exists()


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_deciding_requests_who_may(
    operator, second_operator, viewer, outsider, supervisor, stuck, decision
):
    operation = stuck.mismatch("op-1")
    _act(client_for(operator), operation, "void")
    proposal = ReconciliationRequest.objects.get()
    url = f"/reconciliations/{proposal.pk}/{decision}"
    # an operator without approve_reconciliations, and a viewer: 403, recorded
    assert client_for(second_operator).post(url, {"reason": "x"}).status_code == 403
    assert client_for(viewer).post(url, {"reason": "x"}).status_code == 403
    assert _refused(operation) == [(decision, "forbidden"), (decision, "forbidden")]
    # another provider's user: it does not exist for them
    assert client_for(outsider).post(url, {"reason": "x"}).status_code == 404
    assert (
        client_for(outsider).post("/reconciliations/999999/approve", {"reason": "x"}).status_code
        == 404
    )
    anonymous = Client().post(url, {"reason": "x"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client_for(supervisor).get(url).status_code == 405
    assert client_for(supervisor, csrf_checks=True).post(url, {"reason": "x"}).status_code == 403
    # without a reason: still 403 for who may not decide, and recorded
    assert client_for(viewer).post(url, {"reason": ""}).status_code == 403
    assert _refused(operation)[-1] == (decision, "forbidden")
    no_reason = client_for(supervisor).post(url, {"reason": ""}, follow=True)
    assert f"give a reason to {decision}" in no_reason.content.decode()
    proposal.refresh_from_db()
    assert proposal.status == "pending"


def test_the_requests_page_shows_only_what_the_user_may_view(
    operator, outsider, viewer, stuck, other_stuck
):
    _act(client_for(operator), stuck.mismatch("op-mine"), "void", reason="ours")
    theirs = other_stuck.mismatch("op-theirs")
    _act(client_for(outsider), theirs, "void", reason="theirs")
    page = client_for(viewer).get("/reconciliations/").content.decode()
    assert "op-mine" in page and "op-theirs" not in page
    assert "Approve" not in page  # a viewer sees no buttons
    assert "op-mine" not in client_for(outsider).get("/reconciliations/").content.decode()
    assert Client().get("/reconciliations/").status_code == 302
    assert client_for(viewer).post("/reconciliations/").status_code == 405


def test_the_operation_page_offers_only_what_the_user_may_do(operator, viewer, stuck):
    operation = stuck.mismatch("op-1")
    as_operator = client_for(operator).get(f"/operations/{operation.key}/").content.decode()
    assert "Propose void" in as_operator and "Propose confirm" in as_operator
    assert "Repair receipt" not in as_operator  # not settled: nothing to repair
    as_viewer = client_for(viewer).get(f"/operations/{operation.key}/").content.decode()
    for label in ("Look up now", "void", "confirm", "Claim"):
        assert f">{label}" not in as_viewer and f"Propose {label}" not in as_viewer


def test_a_proposal_stays_on_the_requests_page_when_its_provider_is_renamed(
    operator, supervisor, stuck, provider
):
    from recovery.services.providers import ProviderSettings, provider_save

    _act(client_for(operator), stuck.mismatch("op-1"), "void", reason="customer cancelled")
    provider_save(
        provider_id=provider.pk,
        settings=ProviderSettings(name="orders-eu", adapter="sqlite", path=provider.path),
        actor=Actor.system("test"),
    )
    assert ReconciliationRequest.objects.get().provider == "orders-eu"
    assert "customer cancelled" in client_for(supervisor).get("/reconciliations/").content.decode()


# -- the actions panel: one form per action, each saying what it does ---------------------


def _forms(page: str) -> dict[str, str]:
    """The actions panel's forms, by the last part of their URL (lookup, confirm, …)."""
    found = re.findall(r'<form class="act" method="post" action="([^"]+)">(.*?)</form>', page, re.S)
    return {action.rsplit("/", 1)[-1]: body for action, body in found}


def _said(body: str) -> str:
    """The sentence beside a form's button, as one line of text."""
    sentence = re.search(r'<p class="act-what"[^>]*>(.*?)</p>', body, re.S)
    assert sentence is not None
    return " ".join(re.sub(r"<[^>]+>", "", sentence.group(1)).split())


def test_each_action_has_its_own_reason_and_says_what_it_will_do(operator, stuck):
    operation = stuck.unknown("op-1")  # no record at the provider, receipt stranded
    page = client_for(operator).get(f"/operations/{operation.key}/").content.decode()
    forms = _forms(page)
    assert list(forms) == ["lookup", "confirm", "void"]
    for action, body in forms.items():
        # Its own reason, described by its own sentence, kept across the live redraws.
        assert body.count('name="reason"') == 1
        assert f'id="id_reason_{action}"' in body and "hx-preserve" in body
        assert f'aria-describedby="what-{action}"' in body
        assert f'name="version" value="{operation.version}"' in body
    lookup = _said(forms["lookup"])
    assert "Verified evidence settles it, anything else leaves it here." in lookup
    assert lookup.endswith("Nothing is performed again.")
    confirm = _said(forms["confirm"])
    assert confirm.startswith("Confirm: the effect happened.")
    assert "It would become released (and its stranded receipt succeeded)." in confirm
    assert "a proposal: nothing changes until a second operator approves" in confirm
    void = _said(forms["void"])
    assert "It would become voided, for good (and its stranded receipt failed)." in void
    assert "a proposal for a second operator to approve" in void
    assert void.endswith("You confirm on the next step.")
    assert ">Propose void…</button>" in forms["void"]


def test_a_decision_the_evidence_backs_says_it_is_taken_at_once(operator, stuck):
    backed_confirm = stuck.conflict("op-1", host_says="failed", provider_says="committed")
    page = client_for(operator).get(f"/operations/{backed_confirm.key}/").content.decode()
    confirm = _said(_forms(page)["confirm"])
    assert "matches a committed effect, so it becomes released at once." in confirm
    assert "stranded" not in confirm  # the host reported: no receipt to complete
    assert "void" not in _forms(page)  # the provider says it happened

    backed_void = stuck.conflict("op-2", host_says="committed", provider_says="failed")
    page = client_for(operator).get(f"/operations/{backed_void.key}/").content.decode()
    assert "The provider's record backs it: it becomes voided, for good." in _said(
        _forms(page)["void"]
    )
    assert ">Void…</button>" in page and "Propose void" not in page


def test_a_repair_says_how_it_completes_the_receipt(operator, stuck):
    operation = stuck.released("op-1")
    Dispatch.objects.filter(operation=operation).update(receipt_status="running")
    page = client_for(operator).get(f"/operations/{operation.key}/").content.decode()
    lookup = _said(_forms(page)["lookup"])
    assert "It is released already: the answer is kept as a new snapshot." in lookup
    repair = _said(_forms(page)["repair"])
    assert repair == (
        "Repair the receipt: the host's receipt still says running although the operation is "
        "released. The provider's record backs completing it as succeeded, at once. The "
        "operation itself does not change."
    )


# -- asking before a void -----------------------------------------------------------------


def _void(client: Client, operation: Operation, **data: str):
    sent = {"version": str(operation.version), "reason": "customer cancelled <by phone>", **data}
    return client.post(f"/operations/{operation.key}/void", sent)


def test_a_void_asks_first_saying_what_will_happen_and_changes_nothing(operator, stuck):
    operation = stuck.mismatch("op-1")
    client = client_for(operator)
    asked = _void(client, operation)
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "<title>Propose voiding op-1? · Settle</title>" in page
    assert "Nothing changes yet." in page and "proposal lapses" in page
    assert "<q>customer cancelled &lt;by phone&gt;</q>" in page
    # The second submit carries what the first did, and says it was confirmed.
    form = page[page.index('<form class="ask-buttons"') :]
    assert 'action="/operations/op-1/void"' in form
    assert f'name="version" value="{operation.version}"' in form
    assert 'name="reason" value="customer cancelled &lt;by phone&gt;"' in form
    assert 'name="confirmed" value="on"' in form
    assert 'href="/operations/op-1/">Cancel and go back</a>' in form
    # Nothing was done, nothing recorded.
    assert not ReconciliationRequest.objects.exists()
    assert _fresh(operation).version == operation.version
    assert not _events(operation, "reconciliation_proposed")
    assert not _events(operation, "operator_refused")

    done = _void(client, operation, confirmed="on")
    assert done.status_code == 302
    proposal = ReconciliationRequest.objects.get()
    assert (proposal.action, proposal.reason) == ("void", "customer cancelled <by phone>")


def test_a_backed_void_says_it_is_final_and_is_done_once_confirmed(operator, stuck):
    operation = stuck.conflict("op-1", host_says="committed", provider_says="failed")
    client = client_for(operator)
    page = _void(client, operation).content.decode()
    assert '<h1 id="ask-title">Void <span class="key">op-1</span>?</h1>' in page
    assert "never dispatched again" in page and ">Void it</button>" in page
    assert _fresh(operation).state == "reconcile"
    _void(client, operation, confirmed="on")
    assert _fresh(operation).state == "voided"


def test_a_void_that_cannot_be_taken_is_refused_at_once_without_asking(supervisor, stuck):
    operation = stuck.conflict("op-1", host_says="failed", provider_says="committed")
    client = client_for(supervisor)
    refused = _void(client, operation)
    assert refused.status_code == 302
    assert "it happened, so it cannot be voided" in client.get(refused["Location"]).content.decode()
    stale = _void(client, operation, version=str(operation.version - 1))
    assert stale.status_code == 302
    assert _refused(operation) == [("void", "evidence_matches"), ("void", "stale_version")]


def test_a_void_without_a_reason_is_not_asked_about(operator, stuck):
    operation = stuck.mismatch("op-1")
    response = _void(client_for(operator), operation, reason=" ")
    assert response.status_code == 302
    assert not ReconciliationRequest.objects.exists()


def test_a_viewer_is_refused_a_void_before_being_asked_to_confirm_it(viewer, stuck):
    operation = stuck.mismatch("op-1")
    response = _void(client_for(viewer), operation)
    assert response.status_code == 403
    assert "Propose voiding" not in response.content.decode()
    assert _refused(operation) == [("void", "forbidden")]
