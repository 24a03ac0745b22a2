"""The statement a person signs and the check of a passkey's assertion over it: real
P-256 signatures from a software passkey (harness/webauthn.py)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from fido2.utils import websafe_decode, websafe_encode

from common.canonical import canonical_dumps
from common.statements import (
    SUBJECTS,
    approval_subject,
    bulk_subject,
    challenge_of,
    reconciliation_subject,
    statement,
    statement_matches,
)
from common.webauthn import SignatureInvalid, assertion_verify, rp_id_named
from harness.webauthn import ORIGIN, RP_ID, UP, UV, SoftPasskey

AT = datetime(2026, 12, 3, 18, 0, tzinfo=UTC)
SUBJECT = {
    "approval_id": "6f1c1a8e-1b47-4a4e-9d3c-0f3a7f5a9e11",
    "operation_key": "op-1",
    "params_digest": "sha256:" + "a" * 64,
}


def _statement(**changed: Any) -> dict[str, str]:
    fields = {"decision": "approve", "person": "user:7:sam", "nonce": "bm9uY2Utbm9uY2Utbm9uY2U"}
    fields.update(changed)
    return statement("approval", at=AT, **{**SUBJECT, **fields})


def _verify(passkey: SoftPasskey, record: dict[str, Any], **changed: Any) -> int:
    options: dict[str, Any] = {
        "public_key": passkey.public_key,
        "record": record,
        "rp_id": RP_ID,
        "origins": [ORIGIN],
    }
    return assertion_verify(**{**options, **changed})


def _refusal(passkey: SoftPasskey, record: dict[str, Any], **changed: Any) -> str:
    with pytest.raises(SignatureInvalid) as refused:
        _verify(passkey, record, **changed)
    return refused.value.reason


def test_the_statement_names_the_decision_and_its_challenge_is_stable():
    signed = _statement()
    assert signed == {
        "kind": "approval",
        **SUBJECT,
        "decision": "approve",
        "person": "user:7:sam",
        "nonce": "bm9uY2Utbm9uY2Utbm9uY2U",
        "at": "2026-12-03T18:00:00+00:00",
    }
    assert challenge_of(signed) == hashlib.sha256(canonical_dumps(signed)).digest()
    # The same statement, whatever the order its fields were given in.
    assert challenge_of(dict(reversed(list(signed.items())))) == challenge_of(signed)
    assert challenge_of(_statement(decision="deny")) != challenge_of(signed)


def test_each_statement_has_a_fresh_nonce_of_sixteen_bytes_or_more():
    one = statement("approval", decision="deny", person="user:7:sam", **SUBJECT)
    two = statement("approval", decision="deny", person="user:7:sam", **SUBJECT)
    assert one["nonce"] != two["nonce"]
    assert len(websafe_decode(one["nonce"])) >= 16
    assert challenge_of(one) != challenge_of(two)


@pytest.mark.parametrize(
    "changed",
    [
        {"kind": "reconciliation"},
        {"decision": "maybe"},
        {"approval_id": None},
    ],
)
def test_a_statement_of_an_unknown_kind_decision_or_subject_is_not_made(changed):
    fields: dict[str, Any] = {"decision": "approve", "person": "user:7:sam", **SUBJECT}
    kind = changed.pop("kind", "approval")
    fields.update(changed)
    fields = {name: value for name, value in fields.items() if value is not None}
    with pytest.raises(ValueError):
        statement(kind, **fields)


def test_a_signed_statement_verifies_and_gives_the_sign_count():
    passkey = SoftPasskey()
    assert _verify(passkey, passkey.record(_statement())) == 1
    assert _verify(passkey, passkey.record(_statement())) == 2
    assert _verify(passkey, passkey.record(_statement()), origins=lambda o: o == ORIGIN) == 3


def test_a_tampered_signature_is_bad_signature():
    passkey = SoftPasskey()
    record = passkey.record(_statement())
    signature = bytearray(websafe_decode(record["signature"]))
    signature[-1] ^= 0x01
    assert _refusal(passkey, {**record, "signature": websafe_encode(bytes(signature))}) == (
        "bad_signature"
    )


def test_another_passkeys_key_is_bad_signature():
    passkey = SoftPasskey()
    record = passkey.record(_statement())
    assert _refusal(passkey, record, public_key=SoftPasskey().public_key) == "bad_signature"


def test_a_record_of_another_statement_is_wrong_challenge():
    passkey = SoftPasskey()
    record = passkey.record(_statement())
    assert _refusal(passkey, {**record, "statement": _statement(decision="deny")}) == (
        "wrong_challenge"
    )


def test_user_presence_alone_is_user_not_verified():
    passkey = SoftPasskey()
    assert _refusal(passkey, passkey.record(_statement(), flags=UP)) == "user_not_verified"
    assert _refusal(passkey, passkey.record(_statement(), flags=UV)) == "user_not_present"


def test_another_origin_or_relying_party_is_refused():
    passkey = SoftPasskey()
    other = passkey.record(_statement(), origin="https://evil.example")
    assert _refusal(passkey, other) == "wrong_origin"
    assert _refusal(passkey, passkey.record(_statement(), rp_id="evil.example")) == "wrong_rp"
    assert _refusal(passkey, passkey.record(_statement()), rp_id="example.com") == "wrong_origin"


def test_a_registration_is_not_an_assertion():
    passkey = SoftPasskey()
    created = passkey.record(_statement(), type="webauthn.create")
    assert _refusal(passkey, created) == "wrong_type"


def test_a_record_that_does_not_parse_is_malformed():
    passkey = SoftPasskey()
    record = passkey.record(_statement())
    assert _refusal(passkey, {**record, "authenticator_data": "AAAA"}) == "malformed"
    assert _refusal(passkey, {k: v for k, v in record.items() if k != "statement"}) == "malformed"
    # Client data whose origin is no text: refused by reason, never a crash.
    client_data = json.loads(websafe_decode(record["client_data_json"]))
    for field, value in (("origin", 5), ("type", ["webauthn.get"])):
        forged = websafe_encode(json.dumps({**client_data, field: value}).encode())
        assert _refusal(passkey, {**record, "client_data_json": forged}) == "malformed", field


def test_the_relying_party_is_read_back_from_the_record():
    passkey = SoftPasskey(rp_id="example.com", origin="https://console.example.com")
    record = passkey.record(_statement())
    assert rp_id_named(record) == "example.com"
    assert assertion_verify(
        public_key=passkey.public_key, record=record, rp_id="example.com", origins=lambda o: True
    )
    # None: the relying party the record names, still one its origin may use.
    assert assertion_verify(
        public_key=passkey.public_key, record=record, rp_id=None, origins=lambda o: True
    )
    insecure = SoftPasskey(rp_id="example.com", origin="http://example.com").record(_statement())
    with pytest.raises(SignatureInvalid) as refused:
        assertion_verify(
            public_key=passkey.public_key, record=insecure, rp_id=None, origins=lambda o: True
        )
    assert refused.value.reason == "wrong_origin"
    with pytest.raises(SignatureInvalid) as refused:
        rp_id_named(SoftPasskey(rp_id="other.org").record(_statement()))
    assert refused.value.reason == "wrong_rp"


def test_statement_matches_only_this_decision_by_this_person():
    record = SoftPasskey().record(_statement())
    this = {**SUBJECT, "decision": "approve", "person": "user:7:sam"}
    assert statement_matches(record, "approval", **this)
    for name, other in [
        ("approval_id", "00000000-0000-0000-0000-000000000000"),
        ("operation_key", "op-2"),
        ("params_digest", "sha256:" + "b" * 64),
        ("decision", "deny"),
        ("person", "user:8:sam"),
    ]:
        assert not statement_matches(record, "approval", **{**this, name: other}), name
    assert not statement_matches({}, "approval", **this)
    # Another kind of decision never matches, whatever its fields.
    assert not statement_matches(record, "reconciliation", **this)


def test_a_statement_of_each_kind_names_its_whole_subject():
    bulk = statement(
        "bulk",
        batch_id="b-1",
        action="void",
        items=3,
        items_digest="sha256:" + "c" * 64,
        decision="approve",
        person="user:7:sam",
    )
    assert bulk["items"] == "3"
    record = SoftPasskey().record(bulk)
    this = {"batch_id": "b-1", "action": "void", "items": 3, "items_digest": "sha256:" + "c" * 64}
    assert statement_matches(record, "bulk", decision="approve", person="user:7:sam", **this)
    assert not statement_matches(
        record, "bulk", decision="approve", person="user:7:sam", **{**this, "items": 4}
    )
    with pytest.raises(ValueError, match="names request_id"):
        statement("reconciliation", decision="approve", person="user:7:sam", **SUBJECT)
    with pytest.raises(ValueError, match="approve, reject"):
        statement(
            "reconciliation",
            decision="deny",
            person="user:7:sam",
            request_id=1,
            operation_key="op-1",
            params_digest="sha256:" + "a" * 64,
            action="void",
        )


def test_each_kind_has_one_subject_builder_naming_its_fields() -> None:
    """The console, the deciding services and the audit log build a subject through these:
    each names exactly the fields a statement of its kind must carry."""
    built = {
        "approval": approval_subject(approval_id=1, operation_key="k", params_digest="d"),
        "reconciliation": reconciliation_subject(
            request_id=1, operation_key="k", params_digest="d", action="void"
        ),
        "bulk": bulk_subject(batch_id=1, action="a", items=2, items_digest="d"),
    }
    assert {kind: sorted(subject) for kind, subject in built.items()} == {
        kind: sorted(fields) for kind, fields in SUBJECTS.items()
    }
