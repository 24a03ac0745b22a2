"""Decisions signed with a passkey, verified from the audit log alone: by ``verify_audit``
(in one go and routinely) and by an export checked offline. Real P-256 signatures from a
software passkey; the log tampered with SQL as a table owner could."""

from __future__ import annotations

import hashlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from fido2 import cbor
from fido2.utils import websafe_decode, websafe_encode
from fido2.webauthn import AuthenticatorData
from guardian.shortcuts import assign_perm

from approvals.models import Approval
from audit.checkpoints import audit_checkpoint
from audit.exported import export_records, export_verify
from audit.hashing import event_export, timestamp
from audit.kinds import AuditKind
from audit.models import AuditEvent
from audit.signed_decisions import Passkeys, signature_problem
from audit.verification import audit_verification_incremental
from audit.verify_walk import VerifyTally, audit_verify
from common.actors import Actor
from common.statements import statement
from console.services.audit_export import sealed_export
from harness.webauthn import RP_ID, SoftPasskey, passkey_register, passkey_unregister
from identity.passkey_signing import signed_record_verify
from recovery.permissions import ProviderPermission as P
from recovery.services.permits import approval_decision
from tests.support.audit import (
    event_data_forged,
    event_data_stored,
    only_problem,
    signature_byte_changed,
)
from tests.support.flow import Flow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def decider(provider) -> User:
    user = User.objects.create_user("sam")
    assign_perm(P.DECIDE_APPROVALS.perm, user, provider)
    return user


@pytest.fixture
def passkey(decider: User) -> SoftPasskey:
    key = SoftPasskey()
    passkey_register(decider, key)
    return key


def _signed_vote(flow: Flow, key: str, person: User, passkey: SoftPasskey) -> AuditEvent:
    """Register an operation, open its approval (passkey required) and sign a vote on it."""
    flow.register(key)
    flow.host_api.post(f"/api/v1/operations/{key}/approvals")
    Approval.objects.filter(operation_key=key).update(passkey_required=True, voting=True)
    approval = Approval.objects.get(operation_key=key)
    signed = statement(
        "approval",
        approval_id=str(approval.pk),
        operation_key=key,
        params_digest=approval.params_digest,
        decision="approve",
        person=Actor.of("user", person).stored,
    )
    record = signed_record_verify(
        user=person, statement=signed, assertion_json=passkey.assertion(signed), rp_id=RP_ID
    )
    approval_decision(
        approval_id=approval.pk,
        approve=True,
        ttl_seconds=60,
        decided_by=Actor.of("user", person),
        reviewed_digest=approval.params_digest,
        signature=record,
    )
    return AuditEvent.objects.get(operation_key=key, kind=AuditKind.APPROVAL_VOTED)


def _exported(tmp_path: Path, export_format: str = "jsonl") -> Path:
    path = tmp_path / f"trail.{export_format}"
    with path.open("w", encoding="utf-8", newline="") as handle:
        handle.writelines(sealed_export(AuditEvent.objects.order_by("id"), export_format))
    return path


def test_a_log_with_signed_votes_verifies(flow, decider, passkey, capsys):
    for key in ("op-1", "op-2"):
        _signed_vote(flow, key, decider, passkey)
    assert list(audit_verify()) == []
    call_command("verify_audit")
    assert "audit log intact" in capsys.readouterr().out


def test_one_signature_byte_changed_breaks_the_log(flow, decider, passkey):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    event_data_stored(voted, signature_byte_changed(voted.data))
    with pytest.raises(CommandError, match=rf"chain 'op-1', event #{voted.seq}: content does not"):
        call_command("verify_audit")


def test_one_signature_byte_changed_and_rehashed_fails_its_signature(flow, decider, passkey):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    event_data_forged(voted, signature_byte_changed(voted.data))
    assert only_problem() == (
        f"chain 'op-1', event #{voted.seq}: its passkey signature does not hold (bad_signature)"
    )
    with pytest.raises(CommandError, match="its passkey signature does not hold"):
        call_command("verify_audit", "--no-checkpoint")


def test_a_rehashed_vote_of_another_decision_fails_its_statement(flow, decider, passkey):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    event_data_forged(voted, {**voted.data, "decision": "deny"})
    assert only_problem() == (
        f"chain 'op-1', event #{voted.seq}: the statement it signs is not this decision"
    )


def test_the_routine_verification_checks_the_signatures_it_reads(flow, decider, passkey):
    flow.register("op-0")
    audit_checkpoint()
    voted = _signed_vote(flow, "op-1", decider, passkey)
    event_data_forged(voted, signature_byte_changed(voted.data))
    audit_checkpoint()  # signs the forged chain: nothing signed it before
    verification = audit_verification_incremental()
    assert verification is not None and not verification.ok
    assert verification.problem == (
        f"chain 'op-1', event #{voted.seq}: its passkey signature does not hold (bad_signature)"
    )


@pytest.mark.parametrize("export_format", ["jsonl", "csv"])
def test_an_export_verifies_offline_and_fails_withsignature_byte_changed(
    flow, decider, passkey, tmp_path, capsys, export_format
):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    path = _exported(tmp_path, export_format)
    call_command("verify_export", str(path))
    assert "1 signed decisions verified" in capsys.readouterr().out

    event_data_forged(voted, signature_byte_changed(voted.data))
    forged = _exported(tmp_path, export_format)
    with pytest.raises(CommandError, match=rf"event #{voted.seq}: its passkey signature does not"):
        call_command("verify_export", str(forged))


def test_an_export_edited_in_a_signature_fails_its_hash(flow, decider, passkey, tmp_path):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    records = [event_export(event) for event in AuditEvent.objects.order_by("id")]
    for record in records:
        if record["id"] == voted.pk:
            record["data"] = signature_byte_changed(record["data"])
    problem = export_verify(records)
    assert problem is not None and problem.seq == voted.seq
    assert problem.reason == "content does not match its hash (edited)"


def test_an_export_without_the_system_chain_cannot_vouch_for_a_signature(
    flow, decider, passkey, tmp_path
):
    _signed_vote(flow, "op-1", decider, passkey)
    path = _exported(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    records = [r for r in export_records(lines, "jsonl") if r["chain"] == "op-1"]
    problem = export_verify(records)
    assert problem is not None and "which no passkey_added event names" in problem.reason


# -- which passkey may have signed: the registrations the system chain names ----------------


def _vote(person: User, passkey: SoftPasskey, **changed: Any) -> dict[str, Any]:
    signed = statement(
        "approval",
        approval_id="6f1c1a8e-1b47-4a4e-9d3c-0f3a7f5a9e11",
        operation_key="op-1",
        params_digest="sha256:" + "a" * 64,
        decision="approve",
        person=Actor.of("user", person).stored,
    )
    return {
        "approval_id": signed["approval_id"],
        "params_digest": signed["params_digest"],
        "decision": "approve",
        "signature": passkey.record(signed),
        **changed,
    }


def _added(passkeys: Passkeys, person: User, passkey: SoftPasskey, at: str) -> None:
    data = {"user_id": person.pk, "credential_id": passkey.id, "public_key": passkey.public_key}
    passkeys.event("passkey_added", at, data)


def _problem(passkeys: Passkeys, person: User, data: dict[str, Any], at: str) -> str | None:
    actor = Actor.of("user", person).stored
    return passkeys.vote_problem(chain="op-1", actor=actor, at=at, data=data)


def test_a_passkey_signs_only_while_it_is_registered_to_the_voter(decider):
    passkey, passkeys = SoftPasskey(), Passkeys()
    vote = _vote(decider, passkey)
    assert "no passkey_added event names" in str(_problem(passkeys, decider, vote, "2026-12-03T10"))
    _added(passkeys, decider, passkey, "2026-12-03T09")
    assert _problem(passkeys, decider, vote, "2026-12-03T10") is None
    assert _problem(passkeys, decider, vote, "2026-12-03T08") == (
        "signed with a passkey registered only after the decision"
    )
    passkeys.event("passkey_removed", "2026-12-03T11", {"credential_id": passkey.id})
    assert _problem(passkeys, decider, vote, "2026-12-03T10") is None
    assert _problem(passkeys, decider, vote, "2026-12-03T12") == (
        "signed with a passkey removed before the decision"
    )


def test_a_passkey_of_someone_else_signs_nothing_for_the_voter(decider):
    other = User.objects.create_user("kim")
    passkey, passkeys = SoftPasskey(), Passkeys()
    _added(passkeys, other, passkey, "2026-12-03T09")
    assert _problem(passkeys, decider, _vote(decider, passkey), "2026-12-03T10") == (
        "signed with a passkey registered to someone else"
    )


def test_the_stored_registrations_are_the_system_chains(decider, passkey):
    spare = SoftPasskey()
    passkey_unregister(passkey_register(decider, spare, name="Spare"))
    stored = Passkeys.stored()
    now = timestamp(AuditEvent.objects.order_by("-id").first().at)
    assert stored.knows(passkey.id) and stored.knows(spare.id)
    vote = _vote(decider, passkey)
    assert _problem(stored, decider, vote, now) is None
    assert _problem(stored, decider, _vote(decider, spare), now) == (
        "signed with a passkey removed before the decision"
    )


def test_signatures_checked_by_the_helper_process_report_the_first_forged_vote(
    flow, decider, passkey, monkeypatch
):
    # Two votes a batch: the helper process checks them while the pass goes on.
    monkeypatch.setattr("audit.signed_decisions.BATCH", 2)
    started: list[int] = []

    class Pool(ProcessPoolExecutor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            started.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("audit.signed_decisions.ProcessPoolExecutor", Pool)
    voted = [_signed_vote(flow, f"op-{n}", decider, passkey) for n in range(1, 6)]
    assert list(audit_verify()) == []
    event_data_forged(voted[2], signature_byte_changed(voted[2].data))
    assert only_problem() == (
        f"chain 'op-3', event #{voted[2].seq}: its passkey signature does not hold (bad_signature)"
    )
    assert len(started) == 2  # one helper process per verification


def test_the_first_problem_in_chain_order_is_named_whether_a_helper_or_the_pass_found_it(
    flow, decider, passkey, monkeypatch
):
    # A signed decision is checked whole (hash and signature) by a helper; the events
    # around it by the pass itself.
    monkeypatch.setattr("audit.signed_decisions.BATCH", 2)
    voted = [_signed_vote(flow, f"op-{n}", decider, passkey) for n in range(1, 6)]
    registered = [AuditEvent.objects.get(operation_key=f"op-{n}", seq=1) for n in range(1, 6)]
    event_data_stored(voted[1], signature_byte_changed(voted[1].data))
    event_data_stored(registered[3], {**registered[3].data, "edited": True})
    assert (
        only_problem()
        == f"chain 'op-2', event #{voted[1].seq}: content does not match its hash (edited)"
    )
    event_data_stored(registered[0], {**registered[0].data, "edited": True})
    assert only_problem() == "chain 'op-1', event #1: content does not match its hash (edited)"


def test_a_problem_a_helper_finds_stops_the_pass(flow, decider, passkey, monkeypatch):
    # Two decisions a batch, and the pass waits for each batch's answer before going on.
    monkeypatch.setattr("audit.signed_decisions.BATCH", 2)
    monkeypatch.setattr("audit.signed_decisions.WAITING_PER_HELPER", 0)
    voted = [_signed_vote(flow, f"op-{n}", decider, passkey) for n in range(1, 6)]
    event_data_forged(voted[0], signature_byte_changed(voted[0].data))
    tally = VerifyTally()
    problems = [str(problem) for problem in audit_verify(tally=tally)]
    assert problems == [
        f"chain 'op-1', event #{voted[0].seq}: its passkey signature does not hold (bad_signature)"
    ]
    # It stopped in op-2's chain, where the batch of op-1's and op-2's decisions was full.
    assert tally.chains == 3  # the system chain, op-1 and op-2
    assert tally.events < AuditEvent.objects.count()


# -- what follows the authenticator data's fixed part is read as fido2 reads it ------------


def _resigned(passkey: SoftPasskey, record: dict[str, Any], auth_data: bytes) -> dict[str, Any]:
    """``record`` with other authenticator data, signed again by ``passkey``."""
    client_data = websafe_decode(record["client_data_json"])
    signature = passkey.key.sign(
        auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
    )
    return {
        **record,
        "authenticator_data": websafe_encode(auth_data),
        "signature": websafe_encode(signature),
    }


def test_authenticator_data_beyond_its_fixed_part_is_parsed_or_refused():
    passkey = SoftPasskey()
    signed = _vote(User(pk=7, username="sam"), passkey)["signature"]
    fixed = bytearray(websafe_decode(signed["authenticator_data"]))
    assert len(fixed) == 37
    with_extensions = bytearray(fixed)
    with_extensions[32] |= AuthenticatorData.FLAG.ED
    extensions = bytes(with_extensions) + cbor.encode({"credProtect": 1})
    assert signature_problem(passkey.public_key, _resigned(passkey, signed, extensions)) is None
    attested = bytearray(fixed)
    attested[32] |= AuthenticatorData.FLAG.AT
    for auth_data in (
        bytes(with_extensions),  # extensions flagged, none follow
        bytes(attested),  # attested credential data flagged, none follows
        bytes(fixed) + b"\0",  # a byte that belongs to nothing
        bytes(fixed[:36]),  # shorter than the fixed part
    ):
        assert signature_problem(passkey.public_key, _resigned(passkey, signed, auth_data)) == (
            "its passkey signature does not hold (malformed)"
        )


def test_a_vote_forged_as_a_list_naming_a_signature_is_no_crash(flow, decider, passkey):
    voted = _signed_vote(flow, "op-1", decider, passkey)
    event_data_forged(voted, ["signature"])
    # Not a signed decision (no record to check): the pass goes on, and says nothing of it.
    assert list(audit_verify()) == []
