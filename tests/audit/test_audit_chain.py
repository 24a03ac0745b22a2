"""The audit log: a hash chain per operation, signed checkpoints, ``manage.py verify_audit``.

The tamper tests act as someone with full SQL access (they switch the append-only
triggers off, as a table owner can) but without the audit key.
"""

from __future__ import annotations

import contextvars
import json
import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import checkpoints
from audit.alarms import alarm_signed
from audit.chain import (
    audit_append,
    audit_transaction,
    audit_transaction_open,
    audit_transaction_rider,
)
from audit.checkpoints import audit_checkpoint
from audit.hashing import (
    GENESIS_HASH,
    event_columns,
    event_digest,
    event_row_content,
    event_row_digest,
    event_rows,
    timestamp,
)
from audit.models import AuditAlarm, AuditChainHead, AuditCheckpoint, AuditEvent, AuditVouchedHead
from audit.seal import checkpoint_digest, sign, vouched_digest
from audit.verify_walk import audit_verify
from common.actors import Actor
from dbsql.writes import update_sql
from recovery.models import Operation
from recovery.services.locking import operation_lock
from recovery.services.registration import operation_register
from tests.support.audit import events_append, only_problem, sql_as_owner
from tests.support.flow import PARAMS

# Transactional: checkpoints reach their file only when their transaction commits.
pytestmark = pytest.mark.django_db(transaction=True)


def test_each_operation_has_a_chain_of_its_own(operations):
    events_append(operations[0], 2)
    events_append(operations[2], 1)
    chains = {
        key: list(AuditEvent.objects.filter(operation_key=key).order_by("seq"))
        for key in ("op-0", "op-1", "op-2")
    }
    assert [e.seq for e in chains["op-0"]] == [1, 2, 3]
    assert [e.seq for e in chains["op-1"]] == [1]
    assert [e.seq for e in chains["op-2"]] == [1, 2]
    assert chains["op-0"][0].prev_hash == GENESIS_HASH == chains["op-1"][0].prev_hash
    assert chains["op-0"][1].prev_hash == chains["op-0"][0].hash
    assert chains["op-0"][2].prev_hash == chains["op-0"][1].hash
    assert list(audit_verify()) == []


def test_events_without_an_operation_form_the_system_chain(provider, tmp_path):
    from recovery.services.providers import provider_configure

    provider_configure(name="ledger", adapter="journal", path=str(tmp_path / "j.jsonl"))
    system = list(AuditEvent.objects.filter(operation_key="").order_by("seq"))
    assert [e.kind for e in system] == ["provider_configured", "provider_configured"]
    assert [e.seq for e in system] == [1, 2]
    assert list(audit_verify()) == []


def test_intact_log_verifies_and_the_command_checkpoints_it(operations, capsys):
    call_command("verify_audit")
    out = capsys.readouterr().out
    # Three operations' chains and the system chain (the provider's configuration).
    assert "audit log intact: 4 events in 4 chains" in out
    assert "newest checkpoint #1 signed at" in out
    checkpoint = AuditCheckpoint.objects.get()
    assert set(checkpoint.heads) == {"", "op-0", "op-1", "op-2"}


def test_append_outside_an_audit_transaction_is_refused(operations):
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_append(kind="test", operation=operation_lock(operations[0]))


def test_an_audit_transaction_is_open_in_its_own_thread_only_and_closes_with_its_block(
    operations,
):
    """Another thread has its own connection, so its own transactions: a context copied
    to it (as asgiref's ``sync_to_async`` copies one) does not carry the block."""
    assert not audit_transaction_open()
    with audit_transaction():
        assert audit_transaction_open()
        copied = contextvars.copy_context()
        seen: list[bool] = []
        thread = threading.Thread(target=lambda: seen.append(copied.run(audit_transaction_open)))
        thread.start()
        thread.join()
        assert seen == [False]
        with audit_transaction():
            assert audit_transaction_open()
        assert audit_transaction_open()  # the outer block still
    assert not audit_transaction_open()


def test_append_to_an_operation_that_was_not_locked_is_refused(operations):
    with pytest.raises(RuntimeError, match="operation_lock"), audit_transaction():
        audit_append(kind="test", operation=Operation.objects.get(key="op-0"))


def test_a_rolled_back_block_leaves_no_event_and_no_gap(operations):
    with pytest.raises(ZeroDivisionError), audit_transaction():
        audit_append(kind="rolled-back", operation=operation_lock(operations[0]))
        1 / 0  # noqa: B018
    events_append(operations[0], 1)
    kinds = list(
        AuditEvent.objects.filter(operation_key="op-0").order_by("seq").values_list("kind", "seq")
    )
    assert kinds == [("registered", 1), ("test", 2)]
    assert list(audit_verify()) == []


def test_a_failed_inner_block_drops_its_events_but_keeps_the_outer_ones(operations):
    with audit_transaction():
        locked = operation_lock(operations[0])
        audit_append(kind="kept", operation=locked)
        with pytest.raises(ZeroDivisionError), audit_transaction():
            audit_append(kind="dropped", operation=locked)
            1 / 0  # noqa: B018
        audit_append(kind="kept-too", operation=locked)
    kinds = list(AuditEvent.objects.filter(operation_key="op-0").values_list("kind", flat=True))
    assert kinds == ["registered", "kept", "kept-too"]
    assert list(audit_verify()) == []


def test_a_rider_is_written_by_the_events_statement_and_dropped_with_its_block(operations):
    def noted(operation: Operation, count: int) -> Any:
        return update_sql(
            Operation, where={"pk": operation.pk}, values={"lookups_inconclusive": count}
        )

    with CaptureQueriesContext(connection) as queries, audit_transaction():
        locked = operation_lock(operations[0])
        audit_append(kind="kept", operation=locked)
        audit_transaction_rider(noted(operations[1], 7))
        with pytest.raises(ZeroDivisionError), audit_transaction():
            audit_transaction_rider(noted(operations[2], 9))
            1 / 0  # noqa: B018
        assert Operation.objects.get(pk=operations[1].pk).lookups_inconclusive == 0  # not yet
        before = len(queries.captured_queries)
    written = [query["sql"] for query in queries.captured_queries[before:]]
    assert Operation.objects.get(pk=operations[1].pk).lookups_inconclusive == 7
    assert Operation.objects.get(pk=operations[2].pk).lookups_inconclusive == 0
    ridden = [sql for sql in written if "lookups_inconclusive" in sql]
    if connection.vendor == "postgresql":  # the events' statement, the rider in it
        assert len(ridden) == 1 and ridden[0].startswith("WITH r0 AS (UPDATE"), written
        assert 'INSERT INTO "audit_auditevent"' in ridden[0]
    else:  # SQLite has no writing WITH: the riders statements of their own, just before
        assert len(ridden) == 1 and ridden[0].startswith("UPDATE"), written
        events = next(i for i, sql in enumerate(written) if sql.startswith('INSERT INTO "audit_'))
        riders = written[written.index(ridden[0]) : events]
        assert riders and all(sql.startswith("UPDATE") for sql in riders), written
    assert list(audit_verify()) == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the triggers are PostgreSQL's")
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET kind = 'edited'",
        "DELETE FROM audit_auditevent",
        "TRUNCATE audit_auditevent",
        "UPDATE audit_auditcheckpoint SET signature = 'x'",
        "DELETE FROM audit_auditcheckpoint",
        "TRUNCATE audit_auditcheckpoint",
    ],
)
def test_postgres_refuses_to_change_audit_records(operations, statement):
    audit_checkpoint()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)


# -- tampering, found by verify_audit ---------------------------------------------


def test_an_edited_event_is_named(operations):
    events_append(operations[1], 3)
    sql_as_owner(
        "UPDATE audit_auditevent SET actor = 'forged' WHERE operation_key = %s AND seq = %s",
        ["op-1", 3],
    )
    with pytest.raises(CommandError, match=r"chain 'op-1', event #3: content does not match"):
        call_command("verify_audit")


def test_a_deleted_event_is_named(operations):
    events_append(operations[1], 3)
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq = %s", ["op-1", 2])
    assert only_problem() == "chain 'op-1', event #2: this event is missing (deleted)"


def test_events_cut_from_the_tail_are_found_by_the_checkpoint(operations):
    events_append(operations[1], 3)
    audit_checkpoint()
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq > %s", ["op-1", 2])
    problem = only_problem()
    assert problem.startswith("chain 'op-1', event #3: events after #2 are missing")
    assert "checkpoint #1 names #4 (cut)" in problem


def test_a_truncated_log_is_found_by_the_checkpoints(operations):
    audit_checkpoint()
    sql_as_owner("TRUNCATE audit_auditevent")
    assert "every event of this chain is missing" in only_problem()


def test_truncating_events_and_checkpoints_is_found_by_the_checkpoint_file(operations):
    audit_checkpoint()
    sql_as_owner("TRUNCATE audit_auditevent")
    sql_as_owner("TRUNCATE audit_auditcheckpoint")
    assert only_problem() == ("checkpoint #1 of the checkpoint file is missing from the database")


def test_a_deleted_newest_checkpoint_is_found_by_the_checkpoint_file(operations):
    audit_checkpoint()
    events_append(operations[0], 1)
    audit_checkpoint()
    sql_as_owner("DELETE FROM audit_auditcheckpoint WHERE number = 2")
    assert only_problem() == ("checkpoint #2 of the checkpoint file is missing from the database")


def test_checkpoint_file_lines_spelled_otherwise_are_read_and_still_verify(operations, settings):
    """Lines not byte for byte what this version writes (an older writer's spacing and
    key order) are parsed and checked on their own, as before."""
    audit_checkpoint()
    events_append(operations[0], 1)
    audit_checkpoint()
    path = settings.SETTLE_AUDIT_CHECKPOINT_FILE
    written = path.read_text("utf-8")
    lines = [json.loads(line) for line in written.splitlines()]
    respelled = "".join(
        json.dumps(dict(reversed(line.items())), separators=(",", ":")) + "\n" for line in lines
    )
    assert respelled != written
    path.write_text(respelled)
    assert list(audit_verify()) == []
    lines[1]["watermark"] += 1
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert only_problem() == (
        "checkpoint #2 was edited (its digest does not match) (checkpoint file, line 2)"
    )


def _rewrite_chain(key: str, edit_seq: int) -> None:
    """Edit one event and recompute every hash after it, as anyone can without the key."""
    prev = GENESIS_HASH
    for event in AuditEvent.objects.filter(operation_key=key).order_by("seq"):
        if event.seq == edit_seq:
            event.actor = Actor.system("forged")
        event.prev_hash = prev
        digest = event_digest(event)
        sql_as_owner(
            "UPDATE audit_auditevent SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [event.actor.stored if event.actor else "", prev, digest, event.pk],
        )
        prev = digest


def test_a_full_rewrite_with_recomputed_hashes_is_found_by_the_signed_checkpoint(operations):
    events_append(operations[1], 3)
    audit_checkpoint()
    _rewrite_chain("op-1", 2)
    assert only_problem() == (
        "chain 'op-1', event #4: differs from what checkpoint #1 signed (rewritten)"
    )


def test_a_checkpoint_re_signed_without_the_key_is_refused(operations, settings):
    events_append(operations[1], 2)
    audit_checkpoint()
    _rewrite_chain("op-1", 2)
    # The forger recomputes the checkpoint too, but signs with a key of their own.
    real_key = settings.SETTLE_AUDIT_KEY
    settings.SETTLE_AUDIT_KEY = "the forger's key, not the real one, 32+ chars"
    checkpoint = AuditCheckpoint.objects.get()
    heads = dict(checkpoint.heads)
    heads["op-1"] = [3, AuditEvent.objects.get(operation_key="op-1", seq=3).hash]
    checkpoint.heads = heads
    checkpoint.digest = checkpoint_digest(checkpoint)
    checkpoint.signature = sign(checkpoint.digest)
    sql_as_owner(
        "UPDATE audit_auditcheckpoint SET heads = %s, digest = %s, signature = %s WHERE number = 1",
        [json.dumps(heads), checkpoint.digest, checkpoint.signature],
    )
    settings.SETTLE_AUDIT_KEY = real_key
    assert only_problem() == "checkpoint #1 is not signed by the audit key"


def test_a_missing_checkpoint_file_is_a_problem(operations, settings):
    audit_checkpoint()
    settings.SETTLE_AUDIT_CHECKPOINT_FILE.unlink()
    assert only_problem().startswith("the checkpoint file")


def test_checkpoints_vouch_only_for_what_moved(operations):
    first = audit_checkpoint()
    assert first is not None and set(first.heads) == {"", "op-0", "op-1", "op-2"}
    assert audit_checkpoint() is None  # nothing new
    events_append(operations[2], 1)
    second = audit_checkpoint()
    assert second is not None and second.prev_digest == first.digest
    assert second.heads["op-2"][0] == 2
    assert list(audit_verify()) == []


# -- concurrency ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_appenders_on_many_operations_keep_every_chain_linear(host, provider):
    """Eight threads, each with its own connection and operation, append at once."""
    keys = [f"race-{n}" for n in range(8)]
    for key in keys:
        operation_register(
            host=host, key=key, action="payment.send", provider_name="orders", params=PARAMS
        )
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def appender(key: str) -> None:
        try:
            operation = Operation.objects.get(key=key)
            barrier.wait(timeout=10)
            events_append(operation, 15)
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=appender, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert list(audit_verify()) == []
    for key in keys:
        seqs = list(AuditEvent.objects.filter(operation_key=key).values_list("seq", flat=True))
        assert sorted(seqs) == list(range(1, 17))


def test_a_cut_inside_the_window_is_found_by_the_operations_own_head(operations):
    """No checkpoint yet, but the operation's row still names its newest event."""
    events_append(operations[1], 2)
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq = %s", ["op-1", 3])
    assert only_problem() == (
        "chain 'op-1', event #3: the operation's row names a different head for its chain"
    )


@pytest.mark.parametrize("chunk_size", [1, 2, 5000])
def test_stored_heads_are_compared_in_ranges_that_follow_the_chains(host, provider, chunk_size):
    """Operations are compared page by page along their keys: those between pages, those
    with no event and the last ones are compared too, and an intact log passes."""
    keys = [f"op-{n}" for n in range(7)]
    for key in keys:
        operation_register(
            host=host, key=key, action="payment.send", provider_name="orders", params=PARAMS
        )
    for key in keys[::2]:
        events_append(Operation.objects.get(key=key), 2)
    assert list(audit_verify(chunk_size=chunk_size)) == []
    # Each problem alone: a cut tail (op-3, between appended chains), a chain wholly
    # deleted (op-5: no event left, its row still names #1), the last operation's head
    # moved past its chain (op-6).
    for key, sql, params, seq in (
        ("op-3", "DELETE FROM audit_auditevent WHERE operation_key = %s", ["op-3"], 1),
        ("op-5", "DELETE FROM audit_auditevent WHERE operation_key = %s", ["op-5"], 1),
        (
            "op-6",
            "DELETE FROM audit_auditevent WHERE operation_key = %s AND seq = 3",
            ["op-6"],
            3,
        ),
    ):
        sql_as_owner(sql, params)
        problems = [str(found) for found in audit_verify(chunk_size=chunk_size)]
        assert problems == [
            f"chain {key!r}, event #{seq}: the operation's row names a different head for its chain"
        ]
        Operation.objects.filter(key=key).update(
            audit_seq=AuditEvent.objects.filter(operation_key=key).count(),
            audit_hash=(
                AuditEvent.objects.filter(operation_key=key)
                .order_by("-seq")
                .values_list("hash", flat=True)
                .first()
                or ""
            ),
        )
    assert list(audit_verify(chunk_size=chunk_size)) == []


def test_a_cut_that_also_rewinds_the_operations_head_is_found_by_the_checkpoint(operations):
    events_append(operations[1], 2)
    audit_checkpoint()
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq = %s", ["op-1", 3])
    previous = AuditEvent.objects.get(operation_key="op-1", seq=2)
    Operation.objects.filter(key="op-1").update(audit_seq=2, audit_hash=previous.hash)
    assert "checkpoint #1 names #3 (cut)" in only_problem()


# -- checkpoints extend what was signed, never replace it ---------------------------


def _reinsert_chain(key: str, edit_seq: int) -> None:
    """Rewrite a chain as a forger would: every event deleted, then inserted again with
    new ids, one edited and every hash from there recomputed; the stored head moved too."""
    events = list(AuditEvent.objects.filter(operation_key=key).order_by("seq"))
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s", [key])
    prev = GENESIS_HASH
    for event in events:
        if event.seq == edit_seq:
            event.actor = Actor.system("forged")
        event.prev_hash = prev
        event.hash = event_digest(event)
        sql_as_owner(
            "INSERT INTO audit_auditevent (seq, at, kind, operation_key, actor, data,"
            " prev_hash, hash) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                event.seq,
                event.at,
                event.kind,
                event.operation_key,
                event.actor.stored if event.actor else "",
                json.dumps(event.data),
                event.prev_hash,
                event.hash,
            ],
        )
        prev = event.hash
    if key:
        Operation.objects.filter(key=key).update(audit_seq=events[-1].seq, audit_hash=prev)
    else:
        AuditChainHead.objects.filter(chain="").update(seq=events[-1].seq, hash=prev)


def test_a_routine_checkpoint_after_a_rewrite_refuses_to_sign_it_and_raises_the_alarm(
    operations, caplog
):
    events_append(operations[1], 3)
    first = audit_checkpoint()
    _reinsert_chain("op-1", 2)
    events_append(operations[2], 1)  # another chain moves meanwhile, and holds

    with caplog.at_level("ERROR", logger="settle.audit"):
        second = audit_checkpoint()

    assert first is not None and second is not None
    assert "op-1" not in second.heads  # not re-signed ...
    assert second.heads["op-2"][0] == 2  # ... while the chains that hold are
    assert second.broken == [
        {"chain": "op-1", "seq": 4, "reason": "differs from what checkpoint #1 signed (rewritten)"}
    ]
    alarm = AuditAlarm.objects.get()
    assert (alarm.kind, alarm.chain, alarm.seq, alarm.checkpoint) == ("audit_broken", "op-1", 4, 2)
    assert alarm.open and alarm_signed(alarm)
    assert "audit_broken: checkpoint #2 did not sign chain 'op-1', event #4" in caplog.text
    # The routine checkpoint laundered nothing: the rewrite is still found.
    with pytest.raises(CommandError, match="differs from what checkpoint #1 signed"):
        call_command("verify_audit", "--no-checkpoint")


def test_a_chain_rewritten_in_place_is_refused_when_it_next_moves(operations):
    events_append(operations[1], 3)
    audit_checkpoint()
    _rewrite_chain("op-1", 2)  # same ids: no checkpoint sees it move ...
    rewritten = AuditEvent.objects.get(operation_key="op-1", seq=4)
    Operation.objects.filter(key="op-1").update(audit_seq=4, audit_hash=rewritten.hash)
    events_append(Operation.objects.get(key="op-1"), 1)  # ... until the operation moves on
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and "op-1" not in checkpoint.heads
    assert checkpoint.broken[0]["chain"] == "op-1"
    assert "rewritten" in checkpoint.broken[0]["reason"]


def test_a_cut_tail_with_a_rewound_head_is_refused_when_the_chain_grows_again(operations):
    events_append(operations[1], 3)
    audit_checkpoint()  # signs op-1 at #4
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq > %s", ["op-1", 2])
    kept = AuditEvent.objects.get(operation_key="op-1", seq=2)
    Operation.objects.filter(key="op-1").update(audit_seq=2, audit_hash=kept.hash)
    events_append(Operation.objects.get(key="op-1"), 3)  # grows again to #5, over the cut
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and "op-1" not in checkpoint.heads
    assert checkpoint.broken == [
        {"chain": "op-1", "seq": 4, "reason": "differs from what checkpoint #1 signed (rewritten)"}
    ]
    assert "differs from what checkpoint #1 signed" in only_problem()


def test_a_chain_cut_below_its_signed_head_is_refused(operations):
    events_append(operations[1], 3)
    audit_checkpoint()
    _reinsert_chain("op-1", 2)
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = %s AND seq > %s", ["op-1", 2])
    kept = AuditEvent.objects.get(operation_key="op-1", seq=2)
    Operation.objects.filter(key="op-1").update(audit_seq=2, audit_hash=kept.hash)
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and checkpoint.heads == {}
    assert checkpoint.broken == [
        {
            "chain": "op-1",
            "seq": 3,
            "reason": "events after #2 are missing; checkpoint #1 signed #4 (cut)",
        }
    ]


def test_a_chain_still_broken_keeps_one_open_alarm(operations):
    events_append(operations[1], 1)
    audit_checkpoint()
    _reinsert_chain("op-1", 1)
    audit_checkpoint()
    events_append(Operation.objects.get(key="op-1"), 1)
    third = audit_checkpoint()
    assert third is not None and third.broken[0]["chain"] == "op-1"
    assert AuditAlarm.objects.count() == 1


def test_a_checkpoint_reads_only_the_events_since_the_signed_head(operations, monkeypatch):
    events_append(operations[1], 5)
    audit_checkpoint()  # signs op-1 at #6
    events_append(Operation.objects.get(key="op-1"), 2)
    read: dict[str, list[int]] = {}
    real = checkpoints.extension_break

    def spy(chain, vouched, head_seq, events):
        read[chain] = [row.seq for row in events]
        return real(chain, vouched, head_seq, events)

    monkeypatch.setattr(checkpoints, "extension_break", spy)
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and checkpoint.heads["op-1"][0] == 8
    assert read["op-1"] == [6, 7, 8]  # the signed head and what is new, not the chain
    assert AuditVouchedHead.objects.get(chain="op-1").seq == 8


def test_a_forged_vouched_head_is_refused_and_named(operations):
    events_append(operations[1], 2)
    audit_checkpoint()
    _reinsert_chain("op-1", 1)
    forged = AuditEvent.objects.get(operation_key="op-1", seq=3)
    AuditVouchedHead.objects.filter(chain="op-1").update(hash=forged.hash)  # no key to sign
    events_append(Operation.objects.get(key="op-1"), 1)
    checkpoint = audit_checkpoint()
    assert checkpoint is not None
    assert checkpoint.broken[0]["reason"] == (
        "its vouched head is not signed by the audit key (forged)"
    )


def test_a_deleted_vouched_head_lets_a_checkpoint_sign_but_verify_still_finds_the_rewrite(
    operations,
):
    """The limit of what one checkpoint proves: with its vouched head gone too, a chain
    looks new to the next checkpoint. Every checkpoint's signature still stands, and
    ``verify_audit`` checks every chain against all of them."""
    events_append(operations[1], 3)
    audit_checkpoint()
    _reinsert_chain("op-1", 2)
    AuditVouchedHead.objects.filter(chain="op-1").delete()
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and "op-1" in checkpoint.heads
    assert only_problem() == (
        "chain 'op-1', event #4: differs from what checkpoint #1 signed (rewritten)"
    )


def test_verify_checks_each_chain_against_every_checkpoint_not_only_the_newest(
    operations, settings
):
    """A checkpoint made by a key holder over a rewritten chain (as the code before this
    one did) does not hide what an earlier checkpoint signed."""
    events_append(operations[1], 3)
    first = audit_checkpoint()
    assert first is not None
    _reinsert_chain("op-1", 2)
    rewritten = AuditEvent.objects.get(operation_key="op-1", seq=4)
    laundering = AuditCheckpoint(
        number=2,
        made_at=first.made_at,
        rescan_from=0,
        watermark=rewritten.pk,
        heads={"op-1": [4, rewritten.hash]},
        prev_digest=first.digest,
    )
    laundering.digest = checkpoint_digest(laundering)
    laundering.signature = sign(laundering.digest)
    laundering.save()
    checkpoints._checkpoint_file_append(laundering)
    AuditVouchedHead.objects.filter(chain="op-1").update(
        hash=rewritten.hash,
        checkpoint=2,
        signature=sign(vouched_digest(chain="op-1", seq=4, hash=rewritten.hash, checkpoint=2)),
    )
    assert only_problem() == (
        "chain 'op-1', event #4: differs from what checkpoint #1 signed (rewritten)"
    )


def test_a_rolled_back_vouched_head_is_named_by_verify(operations):
    events_append(operations[1], 1)
    audit_checkpoint()
    old = AuditVouchedHead.objects.get(chain="op-1")
    events_append(Operation.objects.get(key="op-1"), 1)
    audit_checkpoint()
    AuditVouchedHead.objects.filter(chain="op-1").update(
        seq=old.seq, hash=old.hash, checkpoint=old.checkpoint, signature=old.signature
    )
    assert only_problem() == (
        "chain 'op-1', event #2: its vouched head is not the newest head the checkpoints "
        "signed (rolled back)"
    )


# -- the system chain ----------------------------------------------------------------


def test_the_system_chain_keeps_its_head_like_every_other_chain(provider, tmp_path):
    from recovery.services.providers import provider_configure

    provider_configure(name="ledger", adapter="journal", path=str(tmp_path / "j.jsonl"))
    last = AuditEvent.objects.filter(operation_key="").order_by("-seq").first()
    assert last is not None
    head = AuditChainHead.objects.get(chain="")
    assert (head.seq, head.hash) == (last.seq, last.hash) == (2, last.hash)
    assert list(audit_verify()) == []


def test_a_cut_of_the_system_chain_inside_the_window_is_found_by_its_head(provider, tmp_path):
    from recovery.services.providers import provider_configure

    provider_configure(name="ledger", adapter="journal", path=str(tmp_path / "j.jsonl"))
    sql_as_owner("DELETE FROM audit_auditevent WHERE operation_key = '' AND seq = 2")
    assert only_problem() == (
        "the system chain, event #2: the system chain's head row names a different head"
    )


def test_a_rewritten_system_chain_is_refused_by_the_next_checkpoint(provider, tmp_path):
    from recovery.services.providers import provider_configure

    audit_checkpoint()  # signs the system chain at #1
    _reinsert_chain("", 1)
    provider_configure(name="ledger", adapter="journal", path=str(tmp_path / "j.jsonl"))
    checkpoint = audit_checkpoint()
    assert checkpoint is not None and "" not in checkpoint.heads
    assert checkpoint.broken[0]["chain"] == ""
    assert AuditAlarm.objects.get().chain == ""


# -- alarms ------------------------------------------------------------------------


@pytest.fixture
def alarm(operations) -> AuditAlarm:
    events_append(operations[1], 1)
    audit_checkpoint()
    _reinsert_chain("op-1", 1)
    audit_checkpoint()
    return AuditAlarm.objects.get()


def test_a_deleted_alarm_is_named_by_verify(alarm):
    AuditAlarm.objects.all().delete()
    assert _alarm_problems() == [
        "checkpoint #2 found chain 'op-1' broken, but its alarm is missing (deleted)"
    ]


def test_an_alarm_marked_resolved_off_the_record_is_named_by_verify(alarm):
    AuditAlarm.objects.filter(pk=alarm.pk).update(resolved_at=alarm.raised_at)
    assert list(_alarm_problems()) == [
        f"audit alarm {alarm.pk} is marked resolved, but no one resolved it"
    ]


def test_a_forged_alarm_is_named_by_verify(alarm):
    AuditAlarm.objects.filter(pk=alarm.pk).update(reason="nothing to see")
    assert list(_alarm_problems()) == [f"audit alarm {alarm.pk} is not signed by the audit key"]


def _alarm_problems() -> list[str]:
    from audit.seal_verify import _checkpoints_verified
    from audit.verify_walk import _alarms_disagree

    checkpointed, problem = _checkpoints_verified()
    assert problem is None
    return [str(found) for found in _alarms_disagree(checkpointed.broken)]


def test_an_event_read_as_columns_hashes_as_the_model_does(operations):
    """``verify_audit`` and checkpoints read events as column tuples: every field must be
    read back to the text the model hashes (the timestamp's, the actor's, the data's)."""
    datas = [
        {"amount": 12.5, "ratio": 1e-7, "whole": 3.0},
        {"name": "Zoë ☃ 𝄞", "ctl": "\x01\n\t\u2028", "é": [1, {"b": None, "a": True}]},
        {"big": 2**53 - 1, "bigger": str(2**64), "neg": -(2**53 - 1)},
        {},
    ]
    actors = [Actor.system("worker"), Actor("host", "7", "fleet:east"), None]
    # A whole second (microsecond 0) and one with a fraction: both spelled with six digits.
    for moment in (
        datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),
        datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=UTC),
    ):
        with time_machine.travel(moment, tick=False):
            for n, data in enumerate(datas):
                with audit_transaction():
                    audit_append(
                        kind="test",
                        operation=operation_lock(operations[0]),
                        actor=actors[n % len(actors)],
                        data=data,
                    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {event_columns()} FROM audit_auditevent ORDER BY operation_key, seq"
        )
        rows = list(event_rows(cursor.fetchall()))
    events = list(AuditEvent.objects.order_by("operation_key", "seq"))
    assert len(rows) == len(events) >= 2 * len(datas)
    for row, event in zip(rows, events, strict=True):
        assert (row.chain, row.seq) == (event.operation_key, event.seq)
        assert event_row_digest(row) == event_digest(event) == event.hash
        # The data the check hands on is the event's, as the model reads it.
        assert event_row_content(row) == (None, event.data)
    # And an edit of any one column changes the row's digest.
    row = max((row for row in rows if row.chain == "op-0"), key=lambda row: row.seq)
    assert row.at == "2026-03-04T05:06:07.000089Z"
    for edited in (
        row._replace(at=row.at.replace(".000089", ".000090")),
        row._replace(actor="host:7:fleet:west"),
        row._replace(data='{"extra": 1}'),
        row._replace(kind="other"),
    ):
        assert event_row_digest(edited) != row.hash
        problem, data = event_row_content(edited)
        assert problem is not None and data is None


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 12, 8, 1, 2, 3, 456789, tzinfo=UTC),
        datetime(2026, 12, 8, 1, 2, 3, tzinfo=UTC),  # no microseconds: still six digits
        datetime(1000, 1, 1, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),  # strftime's year, unpadded
        datetime(2026, 12, 8, 3, 2, 3, 7, tzinfo=timezone(timedelta(hours=2))),
    ],
)
def test_a_moments_text_is_strftimes_in_utc_whichever_way_it_is_written(at: datetime) -> None:
    assert timestamp(at) == at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert timestamp(at).endswith("Z") and "+" not in timestamp(at)
