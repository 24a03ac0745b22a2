"""A customer's passkey signs their decision: the browser's request names only their own
current passkeys, and the answer is checked against them alone. A passkey of another
party or another host signs nothing, and each refusal is on the operation's chain."""

from __future__ import annotations

import pytest

from approvals.models import Approval, PartyPasskey
from approvals.services.parties import (
    party_actor,
    party_enrolment_request,
    party_passkey_enrol,
    party_passkey_remove,
)
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from common.statements import approval_subject, statement
from common.webauthn import assertion_verify
from customers.passkeys import party_signed_record_verify, party_signing_options
from harness.webauthn import ORIGIN, RP_ID, SoftPasskey
from tests.support.flow import Flow

pytestmark = pytest.mark.django_db
HOST = Actor("host", "1", "fleet-a")


def _enrolled(key: SoftPasskey, *, host: str = "fleet-a", party: str = "cust_1") -> PartyPasskey:
    _, token = party_enrolment_request(host=host, party=party, actor=HOST)
    return party_passkey_enrol(token=token, credential_id=key.id, public_key=key.public_key)


@pytest.fixture
def approval(flow: Flow) -> Approval:
    flow.register("op-1")
    flow.host_api.post("/api/v1/operations/op-1/approvals")
    return Approval.objects.get(operation_key="op-1")


def _statement(approval: Approval, passkey: PartyPasskey) -> dict[str, str]:
    subject = approval_subject(
        approval_id=approval.pk,
        operation_key=approval.operation_key,
        params_digest=approval.params_digest,
    )
    return statement(
        "approval", subject, decision="approve", person=party_actor(passkey.party).stored
    )


def _verify(passkey: PartyPasskey, signed: dict, answer: dict) -> dict:
    return party_signed_record_verify(
        party=passkey.party, statement=signed, assertion_json=answer, relying_party=RP_ID
    )


def _refused(passkey: PartyPasskey, signed: dict, answer: dict) -> SettleError:
    with pytest.raises(SettleError) as refused:
        _verify(passkey, signed, answer)
    return refused.value


def test_the_request_names_the_partys_current_passkeys_only(approval):
    mine, removed, theirs = SoftPasskey(), SoftPasskey(), SoftPasskey()
    passkey = _enrolled(mine)
    gone = _enrolled(removed)
    party_passkey_remove(party=gone.party, passkey_id=gone.pk, actor=HOST)
    _enrolled(theirs, party="cust_2")
    options = party_signing_options(
        party=passkey.party, statement=_statement(approval, passkey), relying_party=RP_ID
    )["publicKey"]
    assert [c["id"] for c in options["allowCredentials"]] == [mine.id]
    assert options["userVerification"] == "required" and options["rpId"] == RP_ID


def test_a_party_without_a_passkey_is_told_to_ask_the_hosts_app(approval):
    passkey = _enrolled(SoftPasskey())
    party_passkey_remove(party=passkey.party, passkey_id=passkey.pk, actor=HOST)
    with pytest.raises(SettleError) as refused:
        party_signing_options(
            party=passkey.party, statement=_statement(approval, passkey), relying_party=RP_ID
        )
    assert refused.value.code == ErrorCode.PARTY_NO_PASSKEY
    assert "ask the app" in refused.value.message


def test_the_partys_passkey_signs_the_statement(approval):
    key = SoftPasskey()
    passkey = _enrolled(key)
    signed = _statement(approval, passkey)
    record = _verify(passkey, signed, key.assertion(signed))
    assert record["statement"] == signed and record["credential_id"] == key.id
    assert assertion_verify(
        public_key=passkey.public_key, record=record, rp_id=RP_ID, origins=[ORIGIN]
    )
    passkey.refresh_from_db()
    assert passkey.sign_count == key.counter


def test_another_partys_passkey_signs_nothing_and_is_recorded(approval):
    passkey = _enrolled(SoftPasskey())
    other_key = SoftPasskey()
    _enrolled(other_key, party="cust_2")
    signed = _statement(approval, passkey)
    refusal = _refused(passkey, signed, other_key.assertion(signed))
    assert refusal.code == ErrorCode.PARTY_PASSKEY_UNKNOWN
    event = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert event.operation_key == "op-1" and event.actor == party_actor(passkey.party)
    assert event.data["code"] == ErrorCode.PARTY_PASSKEY_UNKNOWN


def test_the_same_partys_id_at_another_host_signs_nothing(approval):
    passkey = _enrolled(SoftPasskey())
    elsewhere = SoftPasskey()
    _enrolled(elsewhere, host="fleet-b", party="cust_1")
    signed = _statement(approval, passkey)
    assert _refused(passkey, signed, elsewhere.assertion(signed)).code == (
        ErrorCode.PARTY_PASSKEY_UNKNOWN
    )


def test_a_removed_passkey_signs_nothing(approval):
    key = SoftPasskey()
    passkey = _enrolled(key)
    _enrolled(SoftPasskey())  # the party still has another
    party_passkey_remove(party=passkey.party, passkey_id=passkey.pk, actor=HOST)
    signed = _statement(approval, passkey)
    assert _refused(passkey, signed, key.assertion(signed)).code == ErrorCode.PARTY_PASSKEY_UNKNOWN


def test_a_statement_of_another_person_is_refused(approval):
    key = SoftPasskey()
    passkey = _enrolled(key)
    signed = {**_statement(approval, passkey), "person": "user:1:sam"}
    refusal = _refused(passkey, signed, key.assertion(signed))
    assert refusal.code == ErrorCode.SIGNATURE_INVALID and refusal.extra["reason"] == "wrong_person"


def test_an_answer_over_another_statement_is_refused(approval):
    key = SoftPasskey()
    passkey = _enrolled(key)
    signed = _statement(approval, passkey)
    other = {**signed, "decision": "deny"}
    refusal = _refused(passkey, signed, key.assertion(other))
    assert refusal.code == ErrorCode.SIGNATURE_INVALID
    assert refusal.extra["reason"] == "wrong_challenge"


def test_a_replayed_sign_count_is_refused(approval):
    key = SoftPasskey()
    passkey = _enrolled(key)
    signed = _statement(approval, passkey)
    _verify(passkey, signed, key.assertion(signed, counter=5))
    refusal = _refused(passkey, signed, key.assertion(signed, counter=5))
    assert refusal.code == ErrorCode.SIGN_COUNT_REPLAYED
