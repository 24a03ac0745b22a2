"""Four-eyes decisions signed with a passkey: a reconciliation request and a bulk batch.

The console's two steps (``…/sign`` keeps the statement and answers the WebAuthn
options; the decision's form carries the passkey's answer) with a software passkey
whose assertions go through the same fido2 checks as a browser's. The signature is
kept with the decision and in its audit event, ``verify_audit`` checks it, and one
forged with SQL fails it. Where the policy requires passkeys for the provider, an
unsigned decision is refused, recorded, and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from fido2.utils import websafe_decode

from approvals.models import ReconciliationRequest
from audit.exported import ExportTally, export_verify
from audit.hashing import SYSTEM_CHAIN, event_export
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from bulk.models import BulkBatch, BulkItem
from bulk.services import Pick, bulk_items_digest, bulk_submit
from common.actors import Actor
from common.statements import challenge_of
from harness.webauthn import UP, SoftPasskey, passkey_register
from identity.models import PasskeyUse
from policies.services import policy_apply
from recovery.models import Operation, Provider
from tests.support.audit import (
    event_data_forged,
    only_problem,
    sign_again_recorded,
    signature_byte_changed,
)
from tests.support.console import console_user, run_batch

pytestmark = pytest.mark.django_db

# The console as the browser reaches it on this host: the relying party its passkeys
# were registered for (allauth takes the request's host).
HOST = "localhost"


def _client(user: User) -> Client:
    client = Client(SERVER_NAME=HOST)
    client.force_login(user)
    return client


@pytest.fixture
def approver(provider: Provider) -> User:
    return console_user("sue", "supervisor", provider)


@pytest.fixture
def passkey(approver: User) -> SoftPasskey:
    key = SoftPasskey()
    passkey_register(approver, key)
    return key


def _passkeys_required(provider: Provider) -> None:
    source = f'[providers.{provider.name}]\npasskey = "required"\n'.encode()
    policy_apply(source=source, actor=Actor.system("test"))


def _signed_post(
    client: Client, passkey: SoftPasskey, sign_url: str, decide_url: str, decision: str
) -> Any:
    """Both steps, as the page's script takes them: options for the decision, the
    passkey's assertion over the statement Settle kept, the form with it."""
    options = client.post(sign_url, {"decision": decision})
    assert options.status_code == 200, options.content
    kept = _kept(client)
    challenge = options.json()["publicKey"]["challenge"]
    assert websafe_decode(challenge) == challenge_of(kept)
    credential = json.dumps(passkey.assertion(kept))
    return client.post(
        decide_url, {"reason": "checked the ledger", "credential": credential}, follow=True
    )


def _intact() -> bool:
    return list(audit_verify()) == []


def _kept(client: Client, sign_url: str | None = None, decision: str = "") -> dict[str, str]:
    """The statement the console keeps for the client's signature (asked for first, with
    ``sign_url`` and ``decision``, when given)."""
    if sign_url is not None:
        client.post(sign_url, {"decision": decision})
    [kept] = [v for k, v in client.session.items() if k.startswith("settle_signing:")]
    return kept


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# -- a reconciliation request ----------------------------------------------------------


@pytest.fixture
def proposal(operator: User, stuck) -> ReconciliationRequest:
    operation = stuck.mismatch("op-1")
    client = _client(operator)
    client.post(
        f"/operations/{operation.key}/void",
        {"version": operation.version, "reason": "customer cancelled", "confirmed": "on"},
    )
    return ReconciliationRequest.objects.get()


def _request_urls(proposal: ReconciliationRequest, decision: str) -> tuple[str, str]:
    return (
        f"/reconciliations/{proposal.pk}/sign",
        f"/reconciliations/{proposal.pk}/{decision}",
    )


def test_a_signed_approval_of_a_proposal_is_kept_and_verifies(proposal, approver, passkey):
    page = _client(approver).get("/reconciliations/").content.decode()
    assert "Sign and approve void" in page and "Approve void without signing" in page

    response = _signed_post(
        _client(approver), passkey, *_request_urls(proposal, "approve"), "approve"
    )
    assert _messages(response) == ["Approved and done: the void of op-1."]
    proposal.refresh_from_db()
    assert proposal.status == "approved"
    statement = proposal.signature["statement"]
    assert statement["kind"] == "reconciliation" and statement["action"] == "void"
    assert statement["request_id"] == str(proposal.pk)
    assert statement["params_digest"] == proposal.params_digest
    assert Operation.objects.get(key="op-1").state == "voided"
    event = AuditEvent.objects.get(kind=AuditKind.RECONCILIATION_APPROVED)
    assert event.data["signature"] == proposal.signature
    assert event.data["params_digest"] == proposal.params_digest
    assert _intact()


def test_a_signed_rejection_is_kept_and_verifies(proposal, approver, passkey):
    response = _signed_post(
        _client(approver), passkey, *_request_urls(proposal, "reject"), "reject"
    )
    assert _messages(response) == ["Rejected: the void of op-1."]
    proposal.refresh_from_db()
    assert proposal.status == "rejected"
    assert proposal.signature["statement"]["decision"] == "reject"
    event = AuditEvent.objects.get(kind=AuditKind.RECONCILIATION_REJECTED)
    assert event.data["signature"] == proposal.signature
    assert Operation.objects.get(key="op-1").state == "reconcile"
    assert _intact()


def test_a_rejection_signed_cannot_approve(proposal, approver, passkey):
    client = _client(approver)
    sign_url, _ = _request_urls(proposal, "reject")
    kept = _kept(client, sign_url, "reject")
    credential = json.dumps(passkey.assertion(kept))
    response = client.post(
        f"/reconciliations/{proposal.pk}/approve",
        {"reason": "ok", "credential": credential},
        follow=True,
    )
    [said] = _messages(response)
    assert said.startswith("Refused (signature_invalid)")
    proposal.refresh_from_db()
    assert proposal.status == "pending" and proposal.signature == {}
    # It answers no statement the page kept: the refusal names what the form claimed.
    sign_again_recorded("op-1", approver, "reconciliation", request_id=str(proposal.pk))


def test_where_the_policy_requires_passkeys_an_unsigned_decision_is_refused_and_recorded(
    proposal, approver, provider
):
    _passkeys_required(provider)
    page = _client(approver).get("/reconciliations/").content.decode()
    assert "Only decisions signed with a passkey count here" in page
    assert "Register a passkey" in page and "without signing" not in page

    response = _client(approver).post(
        f"/reconciliations/{proposal.pk}/approve", {"reason": "ok"}, follow=True
    )
    [said] = _messages(response)
    assert said.startswith("Refused (passkey_required)")
    proposal.refresh_from_db()
    assert proposal.status == "pending"
    assert Operation.objects.get(key="op-1").state == "reconcile"
    refused = AuditEvent.objects.filter(operation_key="op-1", kind="operator_refused").last()
    assert refused is not None
    assert (refused.data["action"], refused.data["code"]) == ("approve", "passkey_required")


def test_where_the_policy_requires_passkeys_a_signed_approval_counts(
    proposal, approver, passkey, provider
):
    _passkeys_required(provider)
    page = _client(approver).get("/reconciliations/").content.decode()
    assert "Sign and approve void" in page and "without signing" not in page
    _signed_post(_client(approver), passkey, *_request_urls(proposal, "approve"), "approve")
    proposal.refresh_from_db()
    assert proposal.status == "approved" and proposal.signature


def test_the_operation_page_offers_the_signed_decision(proposal, approver, passkey):
    page = _client(approver).get("/operations/op-1/").content.decode()
    assert "Sign and approve void" in page
    assert f'data-sign-url="/reconciliations/{proposal.pk}/sign"' in page


def test_only_one_who_may_decide_gets_a_statement_to_sign(proposal, operator, viewer):
    sign_url, _ = _request_urls(proposal, "approve")
    assert _client(operator).post(sign_url, {"decision": "approve"}).status_code == 403
    assert _client(viewer).post(sign_url, {"decision": "approve"}).status_code == 403
    refused = _client(operator).post(sign_url, {"decision": "deny"})
    assert refused.json()["error"] == "invalid_field"


def test_one_without_a_passkey_is_told_where_to_register_one(proposal, approver):
    answer = _client(approver).post(f"/reconciliations/{proposal.pk}/sign", {"decision": "approve"})
    assert answer.status_code == 409
    assert answer.json()["error"] == "no_passkey"
    assert answer.json()["register"] == "/accounts/2fa/webauthn/add/"


# -- a bulk batch ----------------------------------------------------------------------


@pytest.fixture
def batch(supervisor: User, stuck) -> BulkBatch:
    operations = [stuck.mismatch(f"x-{n}") for n in range(3)]
    return bulk_submit(
        action="void",
        picks=[Pick(op.pk, op.version) for op in operations],
        selection="picked by hand",
        reason="provider lost these",
        actor=Actor.of("user", supervisor),
    )


def _batch_urls(batch: BulkBatch, decision: str) -> tuple[str, str]:
    return f"/batches/{batch.pk}/sign", f"/batches/{batch.pk}/{decision}"


def test_a_signed_approval_of_a_batch_names_its_items_and_verifies(batch, approver, passkey):
    page = _client(approver).get(f"/batches/{batch.pk}/").content.decode()
    digest = bulk_items_digest(batch=batch)
    assert digest in page and "Sign and approve all 3 voids" in page

    _signed_post(_client(approver), passkey, *_batch_urls(batch, "approve"), "approve")
    batch.refresh_from_db()
    assert batch.status == "running"
    statement = batch.signature["statement"]
    assert (statement["kind"], statement["items"], statement["items_digest"]) == (
        "bulk",
        "3",
        digest,
    )
    event = AuditEvent.objects.get(kind=AuditKind.BULK_APPROVED)
    assert event.data["signature"] == batch.signature and event.data["items_digest"] == digest
    run_batch(batch)
    assert set(Operation.objects.values_list("state", flat=True)) == {"voided"}
    assert _intact()
    page = _client(approver).get(f"/batches/{batch.pk}/").content.decode()
    assert 'title="Signed with a passkey">signed<' in page


def test_the_items_digest_names_each_operation_and_version(batch):
    before = bulk_items_digest(batch=batch)
    item = BulkItem.objects.filter(batch=batch).first()
    assert item is not None
    BulkItem.objects.filter(pk=item.pk).update(version=item.version + 1)
    assert bulk_items_digest(batch=batch) != before


def test_a_batch_signed_before_its_items_changed_is_refused(batch, approver, passkey):
    client = _client(approver)
    kept = _kept(client, f"/batches/{batch.pk}/sign", "approve")
    item = BulkItem.objects.filter(batch=batch).first()
    assert item is not None
    BulkItem.objects.filter(pk=item.pk).update(version=item.version + 1)
    response = client.post(
        f"/batches/{batch.pk}/approve",
        {"reason": "ok", "credential": json.dumps(passkey.assertion(kept))},
        follow=True,
    )
    [said] = _messages(response)
    assert said.startswith("Refused (signature_invalid)")
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"


def test_where_the_policy_requires_passkeys_an_unsigned_batch_decision_is_refused(
    batch, approver, passkey, provider
):
    _passkeys_required(provider)
    response = _client(approver).post(f"/batches/{batch.pk}/approve", {"reason": "ok"}, follow=True)
    [said] = _messages(response)
    assert said.startswith("Refused (passkey_required)")
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"
    refused = AuditEvent.objects.get(kind=AuditKind.BULK_REFUSED)
    assert (refused.data["code"], refused.actor) == ("passkey_required", Actor.of("user", approver))
    # Signed, it runs: each item's four-eyes approval counts as signed by the batch's.
    _signed_post(_client(approver), passkey, *_batch_urls(batch, "approve"), "approve")
    run_batch(batch)
    assert set(Operation.objects.values_list("state", flat=True)) == {"voided"}


def test_a_signed_rejection_of_a_batch_verifies(batch, approver, passkey):
    _signed_post(_client(approver), passkey, *_batch_urls(batch, "reject"), "reject")
    batch.refresh_from_db()
    assert batch.status == "rejected" and batch.signature["statement"]["decision"] == "reject"
    assert AuditEvent.objects.get(kind=AuditKind.BULK_REJECTED).data["signature"]
    assert _intact()


# -- the audit log: forged with SQL -------------------------------------------------------


def test_a_forged_signature_on_a_reconciliation_fails_verification(proposal, approver, passkey):
    _signed_post(_client(approver), passkey, *_request_urls(proposal, "approve"), "approve")
    event = AuditEvent.objects.get(kind=AuditKind.RECONCILIATION_APPROVED)
    event_data_forged(event, signature_byte_changed(event.data))
    assert only_problem() == (
        f"chain 'op-1', event #{event.seq}: its passkey signature does not hold (bad_signature)"
    )


def test_a_signed_approval_rewritten_as_another_action_fails_its_statement(
    proposal, approver, passkey
):
    _signed_post(_client(approver), passkey, *_request_urls(proposal, "approve"), "approve")
    event = AuditEvent.objects.get(kind=AuditKind.RECONCILIATION_APPROVED)
    event_data_forged(event, {**event.data, "action": "confirm"})
    assert only_problem() == (
        f"chain 'op-1', event #{event.seq}: the statement it signs is not this decision"
    )


def test_a_forged_items_digest_on_a_batch_fails_its_statement(batch, approver, passkey):
    _signed_post(_client(approver), passkey, *_batch_urls(batch, "approve"), "approve")
    event = AuditEvent.objects.get(kind=AuditKind.BULK_APPROVED)
    event_data_forged(event, {**event.data, "items_digest": "sha256:" + "0" * 64})
    assert only_problem() == (
        f"the system chain, event #{event.seq}: the statement it signs is not this decision"
    )


def test_an_export_checks_signed_four_eyes_decisions_offline(proposal, batch, approver, passkey):
    _signed_post(_client(approver), passkey, *_request_urls(proposal, "approve"), "approve")
    _signed_post(_client(approver), passkey, *_batch_urls(batch, "reject"), "reject")
    records = [event_export(event) for event in AuditEvent.objects.order_by("id")]
    tally = ExportTally()
    assert export_verify(records, tally=tally) is None
    assert tally.signed_votes == 2

    event = AuditEvent.objects.get(kind=AuditKind.BULK_REJECTED)
    event_data_forged(event, signature_byte_changed(event.data))
    records = [event_export(event) for event in AuditEvent.objects.order_by("id")]
    problem = export_verify(records)
    assert problem is not None and problem.seq == event.seq
    assert problem.reason == "its passkey signature does not hold (bad_signature)"


def test_a_signed_answer_too_large_is_refused_recorded_and_decides_nothing(
    proposal, approver, passkey
):
    client = _client(approver)
    _kept(client, f"/reconciliations/{proposal.pk}/sign", "approve")
    response = client.post(
        f"/reconciliations/{proposal.pk}/approve",
        {"reason": "ok", "credential": "x" * 20_000},
        follow=True,
    )
    [said] = _messages(response)
    assert said.startswith("Refused (signature_invalid)")
    assert ReconciliationRequest.objects.get(pk=proposal.pk).status == "pending"
    refused = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert refused.operation_key == "op-1"
    assert (refused.data["request_id"], refused.data["message"]) == (
        str(proposal.pk),
        "the signed answer is too large",
    )


def test_a_replayed_sign_count_is_refused_recorded_and_decides_nothing(proposal, approver, passkey):
    client = _client(approver)
    kept = _kept(client, f"/reconciliations/{proposal.pk}/sign", "approve")
    first = json.dumps(passkey.assertion(kept, counter=7))
    # A copy of the passkey signed before, with the same count.
    PasskeyUse.objects.create(credential_id=passkey.id, sign_count=7, last_used_at=timezone.now())
    response = client.post(
        f"/reconciliations/{proposal.pk}/approve",
        {"reason": "ok", "credential": first},
        follow=True,
    )
    [said] = _messages(response)
    assert said.startswith("Refused (sign_count_replayed)")
    proposal.refresh_from_db()
    assert proposal.status == "pending"
    refused = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert refused.operation_key == "op-1"
    assert refused.actor == Actor.of("user", approver)
    assert refused.data == {
        "kind": "reconciliation",
        "decision": "approve",
        "code": "sign_count_replayed",
        "message": "the passkey's sign count did not increase: it may have been copied",
        "request_id": str(proposal.pk),
    }
    timeline = client.get("/operations/op-1/").content.decode()
    assert "Passkey-signed decision to approve refused (sign_count_replayed" in timeline


def test_a_batch_signed_without_user_verification_is_refused_on_the_system_chain(
    batch, approver, passkey
):
    client = _client(approver)
    kept = _kept(client, f"/batches/{batch.pk}/sign", "approve")
    unverified = json.dumps(passkey.assertion(kept, flags=UP))
    response = client.post(
        f"/batches/{batch.pk}/approve", {"reason": "ok", "credential": unverified}, follow=True
    )
    [said] = _messages(response)
    assert said.startswith("Refused (signature_invalid)")
    assert BulkBatch.objects.get(pk=batch.pk).status == "proposed"
    refused = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert refused.operation_key == SYSTEM_CHAIN
    assert (refused.data["kind"], refused.data["batch_id"]) == ("bulk", str(batch.pk))
    assert (refused.data["code"], refused.data["message"]) == (
        "signature_invalid",
        "user_not_verified",
    )
