"""A customer's (party's) signed decision, verified from the audit log alone: against the
key its ``party_passkey_added`` event recorded, registered to that party before the
decision and not removed before it; by ``verify_audit`` and by an export checked offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from approvals.models import Approval, PartyPasskey
from approvals.services.parties import (
    party_actor,
    party_enrolment_request,
    party_passkey_enrol,
    party_passkey_remove,
)
from audit.exported import export_records, export_verify
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from common.actors import Actor
from console.services.audit_export import sealed_export
from customers.passkeys import decision_statement, party_signed_record_verify
from harness.webauthn import RP_ID, SoftPasskey
from recovery.services.permits import approval_decision
from tests.support.audit import (
    event_data_forged,
    only_problem,
    signature_byte_changed,
    sql_as_owner,
)
from tests.support.customers import customer_open, customer_policy_apply
from tests.support.flow import Flow

pytestmark = pytest.mark.django_db(transaction=True)
HOST = Actor("host", "1", "fleet-a")
SIGNED_PARAMS = {"amount": 9000, "currency": "EUR", "to": "acct-7"}


def _enrolled(party: str, key: SoftPasskey) -> PartyPasskey:
    _, token = party_enrolment_request(host="fleet-a", party=party, actor=HOST)
    return party_passkey_enrol(token=token, credential_id=key.id, public_key=key.public_key)


def _voted(flow: Flow, key: str, passkey: PartyPasskey, soft: SoftPasskey) -> AuditEvent:
    """The party's vote on an approval addressed to them (customer_passkey), signed with
    ``soft``, checked as the customer page checks it, and decided by the service."""
    customer_policy_apply()
    customer_open(flow, key, params=SIGNED_PARAMS, party={"id": passkey.party.party})
    approval = Approval.objects.get(operation_key=key)
    assert approval.customer_passkey and approval.party_id == passkey.party_id
    signed = decision_statement(approval=approval, party=passkey.party, decision="approve")
    record = party_signed_record_verify(
        party=passkey.party,
        statement=signed,
        assertion_json=soft.assertion(signed),
        relying_party=RP_ID,
    )
    approval_decision(
        approval_id=approval.pk,
        approve=True,
        ttl_seconds=60,
        decided_by=Actor.party(passkey.party),
        reviewed_digest=approval.params_digest,
        signature=record,
    )
    return AuditEvent.objects.get(operation_key=key, kind=AuditKind.APPROVAL_VOTED)


@pytest.fixture
def soft() -> SoftPasskey:
    return SoftPasskey()


@pytest.fixture
def enrolled(db, soft: SoftPasskey) -> PartyPasskey:
    return _enrolled("cust_1", soft)


def _exported(tmp_path: Path) -> Path:
    path = tmp_path / "trail.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(sealed_export(AuditEvent.objects.order_by("id"), "jsonl"))
    return path


def test_a_customers_signed_vote_verifies_in_the_log_and_its_export(
    flow, enrolled, soft, tmp_path, capsys
):
    _voted(flow, "op-1", enrolled, soft)
    assert list(audit_verify()) == []
    call_command("verify_audit")
    assert "audit log intact" in capsys.readouterr().out
    assert (
        export_verify(export_records(_exported(tmp_path).read_text().splitlines(True), "jsonl"))
        is None
    )


def test_a_tampered_customer_signature_fails_verify_audit_and_the_export(
    flow, enrolled, soft, tmp_path
):
    voted = _voted(flow, "op-1", enrolled, soft)
    event_data_forged(voted, signature_byte_changed(voted.data))
    assert only_problem() == (
        f"chain 'op-1', event #{voted.seq}: its passkey signature does not hold (bad_signature)"
    )
    with pytest.raises(CommandError, match="its passkey signature does not hold"):
        call_command("verify_audit", "--no-checkpoint")
    found = export_verify(export_records(_exported(tmp_path).read_text().splitlines(True), "jsonl"))
    assert found is not None and "its passkey signature does not hold" in found.reason


def test_a_vote_whose_actor_is_another_party_fails(flow, enrolled, soft):
    voted = _voted(flow, "op-1", enrolled, soft)
    other = _enrolled("cust_2", SoftPasskey())
    sql_as_owner(
        "UPDATE audit_auditevent SET actor = %s WHERE id = %s",
        [party_actor(other.party).stored, voted.pk],
    )
    event_data_forged(AuditEvent.objects.get(pk=voted.pk), voted.data)
    assert "registered to someone else" in only_problem()


def test_a_vote_signed_after_the_passkey_was_removed_fails(flow, enrolled, soft):
    voted = _voted(flow, "op-1", enrolled, soft)
    party_passkey_remove(party=enrolled.party, passkey_id=enrolled.pk, actor=HOST)
    # The removal, moved before the vote as someone rewriting the system chain would.
    removed = AuditEvent.objects.get(kind=AuditKind.PARTY_PASSKEY_REMOVED)
    sql_as_owner("UPDATE audit_auditevent SET at = %s WHERE id = %s", [voted.at, removed.pk])
    event_data_forged(AuditEvent.objects.get(pk=removed.pk), removed.data)
    problems = [str(problem) for problem in audit_verify()]
    assert any("removed before the decision" in problem for problem in problems), problems


def test_a_passkey_removed_later_still_verifies_what_it_signed(flow, enrolled, soft):
    _voted(flow, "op-1", enrolled, soft)
    party_passkey_remove(party=enrolled.party, passkey_id=enrolled.pk, actor=HOST)
    assert list(audit_verify()) == []
