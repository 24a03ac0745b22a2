"""verify_audit with what the checkpoints signed streamed, not held: the digest and file
line of a checkpoint hashed a head at a time, the file read in pieces, the signed heads
merged with the events in the database's chain order."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from audit import checkpoints
from audit import seal_verify as signed_heads
from audit.checkpoints import audit_checkpoint
from audit.models import AuditCheckpoint, AuditEvent, AuditVouchedHead
from audit.seal import checkpoint_digest, checkpoint_file_line, checkpoint_hashes_streamed, sign
from audit.verify_walk import audit_verify
from common.canonical import MAX_SAFE_INTEGER
from tests.support.audit import events_append, only_problem, sql_as_owner

pytestmark = pytest.mark.django_db(transaction=True)

BROKEN = [{"chain": "op-é", "seq": 2, "reason": "differs \u2028 (rewritten)"}]


def _checkpoint(heads: dict, broken: list | None = None) -> AuditCheckpoint:
    checkpoint = AuditCheckpoint(
        number=3,
        made_at=datetime(2026, 12, 1, 20, 0, 0, 0, tzinfo=UTC),
        rescan_from=7,
        watermark=99,
        heads=heads,
        broken=broken or [],
        prev_digest="sha256:" + "0" * 64,
    )
    checkpoint.digest = checkpoint_digest(checkpoint)
    checkpoint.signature = sign(checkpoint.digest)
    return checkpoint


def _streamed(checkpoint: AuditCheckpoint, separators: tuple[str, str]) -> tuple | None:
    """Its heads as the database hands them: (key, the value's JSON text), by code point."""
    pieces = [
        (key, json.dumps(value, separators=separators))
        for key, value in sorted(checkpoint.heads.items())
    ]
    return checkpoint_hashes_streamed(checkpoint, iter(pieces))


def _whole(checkpoint: AuditCheckpoint) -> tuple[str, bytes]:
    line = checkpoint_file_line(checkpoint).encode("utf-8")
    return checkpoint_digest(checkpoint), hashlib.sha256(line).digest()


ASCII_KEYS = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=12)
VALUES = st.one_of(
    st.tuples(st.integers(0, MAX_SAFE_INTEGER), st.text(max_size=8)).map(list),
    st.tuples(
        st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
        st.floats(allow_nan=False, allow_infinity=False),
    ).map(list),
)


@hypothesis_settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads=st.dictionaries(ASCII_KEYS, VALUES, max_size=8), broken=st.booleans())
def test_a_checkpoint_hashed_a_head_at_a_time_is_the_one_hashed_whole(heads, broken):
    """Any ASCII chains (quotes, backslashes, control characters, the system chain "")
    and any values (negative integers, floats, non-ASCII text): the same digest and the
    same file line, whether the heads come spelled as PostgreSQL or as SQLite spells them."""
    checkpoint = _checkpoint(heads, BROKEN if broken else None)
    assert _streamed(checkpoint, (", ", ": ")) == _whole(checkpoint)
    assert _streamed(checkpoint, (",", ":")) == _whole(checkpoint)


def test_a_checkpoint_with_a_chain_outside_ascii_is_left_to_the_whole_object():
    """Code point order is not RFC 8785's (UTF-16) order beyond ASCII: U+E000 sorts
    before U+1F600 by code point, after it by UTF-16 code unit."""
    heads = {"op-1": [1, "sha256:a"], "\ue000": [2, "sha256:b"], "\U0001f600": [3, "c"]}
    assert _streamed(_checkpoint(heads), (", ", ": ")) is None


def _sign_in(heads: dict) -> AuditCheckpoint:
    """A checkpoint #2 over ``heads``, signed with the key (as a key holder's older writer)."""
    first = AuditCheckpoint.objects.get(number=1)
    checkpoint = AuditCheckpoint(
        number=2,
        made_at=first.made_at,
        rescan_from=0,
        watermark=first.watermark,
        heads=heads,
        prev_digest=first.digest,
    )
    checkpoint.digest = checkpoint_digest(checkpoint)
    checkpoint.signature = sign(checkpoint.digest)
    checkpoint.save()
    checkpoints._checkpoint_file_append(checkpoint)
    return checkpoint


def test_a_stored_checkpoint_with_chains_outside_ascii_verifies_and_its_edit_is_found(
    operations,
):
    audit_checkpoint()
    heads = {"op-1": [1, "sha256:a"], "\ue000": [2, "sha256:b"], "\U0001f600": [3, "sha256:c"]}
    _sign_in(heads)
    checkpointed, problem = signed_heads._checkpoints_verified()
    assert problem is None and sorted(checkpointed.digests) == [1, 2]
    heads["\ue000"] = [2, "sha256:d"]
    sql_as_owner(
        "UPDATE audit_auditcheckpoint SET heads = %s WHERE number = 2", [json.dumps(heads)]
    )
    _, problem = signed_heads._checkpoints_verified()
    assert problem == "checkpoint #2 was edited (its digest does not match)"


def test_a_stored_checkpoint_edited_in_one_head_is_found_streamed(operations):
    audit_checkpoint()
    head = AuditCheckpoint.objects.get().heads["op-2"]
    sql_as_owner(
        "UPDATE audit_auditcheckpoint SET heads = %s WHERE number = 1",
        [json.dumps({**AuditCheckpoint.objects.get().heads, "op-2": [head[0], "sha256:x"]})],
    )
    assert only_problem() == "checkpoint #1 was edited (its digest does not match)"


def test_a_checkpoint_file_line_longer_than_a_piece_is_hashed_in_pieces(
    operations,
    settings,
    monkeypatch,
):
    monkeypatch.setattr(signed_heads, "_FILE_PIECE", 16)
    audit_checkpoint()
    events_append(operations[1], 1)
    audit_checkpoint()
    parsed: list[str] = []
    real = signed_heads.plain_loads
    monkeypatch.setattr(signed_heads, "plain_loads", lambda text: parsed.append(text) or real(text))
    assert list(audit_verify()) == []
    assert parsed == []  # each line was its database checkpoint's, byte for byte
    path = settings.SETTLE_AUDIT_CHECKPOINT_FILE
    written = path.read_text("utf-8")
    signed = AuditEvent.objects.get(operation_key="op-2", seq=1).hash
    path.write_text(written.replace(signed, "sha256:" + "f" * 64, 1))
    assert only_problem() == (
        "checkpoint #1 was edited (its digest does not match) (checkpoint file, line 1)"
    )


@pytest.mark.parametrize("code_points", [True, False])
def test_signed_chains_without_events_are_found_by_the_merge_in_either_order(
    operations,
    monkeypatch,
    code_points,
):
    """Signed chains before, between and after the chains with events; the first one in
    the chains' order is named. ``code_points=False``: the database compares the keys."""
    if not code_points and connection.vendor != "postgresql":
        pytest.skip("SQLite's order is code point order, never asked")
    monkeypatch.setattr(
        signed_heads._ChainOrder,
        "__init__",
        lambda order: setattr(order, "code_points", code_points),
    )
    events_append(operations[1], 1)
    audit_checkpoint()
    assert list(audit_verify()) == []
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key IN ('op-0', 'op-2')")
    assert only_problem() == (
        "chain 'op-0', event #1: every event of this chain is missing; checkpoint #1 names 1"
    )


def test_a_vouched_head_deleted_is_named_after_every_row_is_checked(operations):
    audit_checkpoint()
    AuditVouchedHead.objects.filter(chain__in=["op-0", "op-2"]).delete()
    assert only_problem() == "its vouched head is missing (deleted)"
    forged = AuditVouchedHead.objects.get(chain="op-1")
    AuditVouchedHead.objects.filter(pk=forged.pk).update(seq=forged.seq + 1)
    assert only_problem() == (
        f"chain 'op-1', event #{forged.seq + 1}: its vouched head is not signed by the audit key"
    )


@pytest.mark.parametrize("heads", [[], "op-1", 7])
def test_a_checkpoint_whose_heads_are_not_an_object_is_found_edited(
    operations,
    heads,
):
    audit_checkpoint()
    sql_as_owner(
        "UPDATE audit_auditcheckpoint SET heads = %s WHERE number = 1", [json.dumps(heads)]
    )
    assert only_problem() == "checkpoint #1 was edited (its digest does not match)"
