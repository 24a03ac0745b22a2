"""Signing a decision with one's passkey: the browser's request options, and the check of
what it returns against the person's current passkeys and their sign counts. Real
signatures, from a software passkey (harness/webauthn.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from allauth.core import context
from django.contrib.auth.models import User
from fido2.utils import websafe_decode, websafe_encode

from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.errors import SettleError
from common.statements import challenge_of, statement
from harness.webauthn import RP_ID, UP, SoftPasskey, passkey_register, passkey_unregister
from identity.models import PasskeyUse
from identity.passkey_signing import signed_record_verify, signing_options

pytestmark = pytest.mark.django_db


@pytest.fixture
def person() -> User:
    return User.objects.create_user("sam")


@pytest.fixture
def passkey(person: User) -> SoftPasskey:
    key = SoftPasskey()
    passkey_register(person, key)
    return key


def _statement(user: User, decision: str = "approve") -> dict[str, str]:
    return statement(
        "approval",
        approval_id="6f1c1a8e-1b47-4a4e-9d3c-0f3a7f5a9e11",
        operation_key="op-1",
        params_digest="sha256:" + "a" * 64,
        decision=decision,
        person=Actor.of("user", user).stored,
    )


def _verify(user: User, signed: dict[str, Any], assertion: Any) -> dict[str, Any]:
    return signed_record_verify(user=user, statement=signed, assertion_json=assertion, rp_id=RP_ID)


def _refusal(user: User, signed: dict[str, Any], assertion: Any) -> SettleError:
    with pytest.raises(SettleError) as refused:
        _verify(user, signed, assertion)
    return refused.value


def test_the_options_ask_the_persons_passkeys_to_sign_the_statement_unlocked(person, passkey):
    other = SoftPasskey()
    passkey_register(person, other, name="Phone")
    signed = _statement(person)
    options = signing_options(user=person, statement=signed, rp_id=RP_ID)["publicKey"]
    assert websafe_decode(options["challenge"]) == challenge_of(signed)
    assert options["rpId"] == RP_ID
    assert options["userVerification"] == "required"
    assert {c["id"] for c in options["allowCredentials"]} == {passkey.id, other.id}
    assert options["allowCredentials"][0]["transports"] == ["internal"]
    json.dumps(options)  # as the page hands it to the browser


def test_someone_without_a_passkey_is_told_to_register_one(person):
    with pytest.raises(SettleError) as refused:
        signing_options(user=person, statement=_statement(person), rp_id=RP_ID)
    assert refused.value.code == "no_passkey"
    assert "passkeys page" in refused.value.message


def test_a_signed_statement_gives_the_record_to_keep(person, passkey):
    signed = _statement(person)
    assertion = passkey.assertion(signed)
    record = _verify(person, signed, json.dumps(assertion))
    assert record == {
        "statement": signed,
        "credential_id": passkey.id,
        "authenticator_data": assertion["response"]["authenticatorData"],
        "client_data_json": assertion["response"]["clientDataJSON"],
        "signature": assertion["response"]["signature"],
    }
    use = PasskeyUse.objects.get(credential_id=passkey.id)
    assert use.sign_count == 1


def test_a_signature_over_another_statement_is_refused(person, passkey):
    assertion = passkey.assertion(_statement(person, "deny"))
    refusal = _refusal(person, _statement(person), assertion)
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "wrong_challenge")


def test_a_passkey_not_unlocked_is_refused(person, passkey):
    signed = _statement(person)
    refusal = _refusal(person, signed, passkey.assertion(signed, flags=UP))
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "user_not_verified")


def test_another_origin_is_refused(person, passkey):
    signed = _statement(person)
    refusal = _refusal(person, signed, passkey.assertion(signed, origin="https://evil.example"))
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "wrong_origin")


def test_a_statement_of_another_person_is_refused(person, passkey):
    other = User.objects.create_user("kim")
    signed = _statement(other)
    refusal = _refusal(person, signed, passkey.assertion(signed))
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "wrong_person")


def test_garbage_is_refused_as_malformed(person, passkey):
    refusal = _refusal(person, _statement(person), "{not json")
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "malformed")


def test_authenticator_data_flagging_extensions_it_lacks_is_malformed(person, passkey):
    signed = _statement(person)
    assertion = passkey.assertion(signed)
    data = bytearray(websafe_decode(assertion["response"]["authenticatorData"]))
    data[32] |= 0x80  # ED: extensions follow; none do
    assertion["response"]["authenticatorData"] = websafe_encode(bytes(data))
    refusal = _refusal(person, signed, assertion)
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "malformed")
    recorded = AuditEvent.objects.get(kind=AuditKind.SIGNATURE_REFUSED)
    assert (recorded.data["code"], recorded.data["message"]) == ("signature_invalid", "malformed")


def test_a_removed_passkey_signs_nothing(person, passkey):
    spare = SoftPasskey()
    row = passkey_register(person, spare, name="Spare")
    passkey_unregister(row)
    signed = _statement(person)
    assert _refusal(person, signed, spare.assertion(signed)).code == "passkey_unknown"
    assert not PasskeyUse.objects.exists()


def test_another_persons_passkey_signs_nothing_for_this_one(person, passkey):
    theirs = SoftPasskey()
    passkey_register(User.objects.create_user("kim"), theirs)
    signed = _statement(person)
    assert _refusal(person, signed, theirs.assertion(signed)).code == "passkey_unknown"


def test_a_sign_count_that_did_not_increase_is_refused(person, passkey):
    first = _statement(person)
    _verify(person, first, passkey.assertion(first, counter=5))
    again = _statement(person)
    refusal = _refusal(person, again, passkey.assertion(again, counter=5))
    assert refusal.code == "sign_count_replayed"
    assert refusal.extra == {"sign_count": 5, "last_sign_count": 5}
    lower = _statement(person)
    assert _refusal(person, lower, passkey.assertion(lower, counter=3)).code == (
        "sign_count_replayed"
    )
    assert PasskeyUse.objects.get(credential_id=passkey.id).sign_count == 5
    later = _statement(person)
    _verify(person, later, passkey.assertion(later, counter=6))
    assert PasskeyUse.objects.get(credential_id=passkey.id).sign_count == 6


def test_a_passkey_that_keeps_no_count_may_sign_again(person, passkey):
    for _ in range(2):
        signed = _statement(person)
        _verify(person, signed, passkey.assertion(signed, counter=0))
    assert PasskeyUse.objects.get(credential_id=passkey.id).sign_count == 0
    # Once it has counted, a zero is a count that went back.
    counted = _statement(person)
    _verify(person, counted, passkey.assertion(counted, counter=1))
    zero = _statement(person)
    assert _refusal(person, zero, passkey.assertion(zero, counter=0)).code == (
        "sign_count_replayed"
    )


def test_the_relying_party_is_the_host_allauth_registers_passkeys_for(person, passkey, rf):
    signed = _statement(person)
    with context.request_context(rf.get("/", HTTP_HOST="localhost:8000")):
        options = signing_options(user=person, statement=signed)["publicKey"]
        record = signed_record_verify(
            user=person, statement=signed, assertion_json=passkey.assertion(signed)
        )
    assert options["rpId"] == "localhost"
    assert record["credential_id"] == passkey.id
    with context.request_context(rf.get("/", HTTP_HOST="testserver")):
        again = _statement(person)
        refusal = _refusal_default_rp(person, again, passkey.assertion(again))
    assert (refusal.code, refusal.extra["reason"]) == ("signature_invalid", "wrong_origin")


def _refusal_default_rp(user: User, signed: dict[str, Any], assertion: Any) -> SettleError:
    with pytest.raises(SettleError) as refused:
        signed_record_verify(user=user, statement=signed, assertion_json=assertion)
    return refused.value
