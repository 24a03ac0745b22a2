"""The hash-chained audit log and ``manage.py verify_audit``."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from recovery.audit import audit_append, audit_verify
from recovery.models import AuditEvent

pytestmark = pytest.mark.django_db


def _append(count: int) -> None:
    for number in range(count):
        with transaction.atomic():
            audit_append(kind="test", operation_key=f"op-{number}", data={"n": number})


def _raw_update(sql: str, params: list) -> None:
    """Tamper as someone with direct database access would (bypassing the trigger)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE recovery_auditevent DISABLE TRIGGER USER")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE recovery_auditevent ENABLE TRIGGER USER")


def test_intact_chain_verifies(capsys):
    _append(5)
    assert list(audit_verify()) == []
    call_command("verify_audit")
    assert "audit chain intact: 5 events" in capsys.readouterr().out


def test_each_event_links_to_the_previous_hash():
    _append(3)
    events = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[1].prev_hash == events[0].hash
    assert events[2].prev_hash == events[1].hash


def test_edited_row_is_named_by_verify_audit():
    _append(5)
    _raw_update("UPDATE recovery_auditevent SET operation_key = %s WHERE seq = %s", ["forged", 3])
    with pytest.raises(CommandError, match=r"broken at event #3: content does not match"):
        call_command("verify_audit")


def test_edited_data_is_detected_even_with_a_recomputed_hash_downstream():
    _append(4)
    _raw_update("UPDATE recovery_auditevent SET data = %s WHERE seq = %s", ['{"n": 99}', 2])
    (broken,) = audit_verify()
    assert broken.seq == 2


def test_deleted_row_is_detected():
    _append(4)
    _raw_update("DELETE FROM recovery_auditevent WHERE seq = %s", [2])
    (broken,) = audit_verify()
    assert broken.seq == 2
    assert "missing" in broken.reason


def test_truncated_tail_is_detected_by_the_head():
    _append(4)
    _raw_update("DELETE FROM recovery_auditevent WHERE seq = %s", [4])
    (broken,) = audit_verify()
    assert broken.seq == 4


@pytest.mark.django_db(transaction=True)
def test_append_outside_a_transaction_is_refused():
    with pytest.raises(RuntimeError):
        audit_append(kind="test")


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's"
)
def test_postgres_refuses_updates_to_audit_events():
    _append(1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.update(kind="edited")


@pytest.mark.django_db(transaction=True)
def test_concurrent_appenders_never_fork_the_chain():
    """Eight threads, each with its own connection, append at once; one linear chain."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def appender(number: int) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(15):
                with transaction.atomic():
                    audit_append(kind="race", data={"thread": number, "i": i})
                    if i % 5 == 4:
                        audit_append(kind="race-second", data={"thread": number, "i": i})
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=appender, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert list(audit_verify()) == []
    assert list(AuditEvent.objects.values_list("seq", flat=True)) == list(range(1, 8 * 18 + 1))


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_append_does_not_poison_the_next_one():
    with transaction.atomic():
        audit_append(kind="kept")
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        audit_append(kind="rolled-back")
        1 / 0  # noqa: B018
    with transaction.atomic():
        audit_append(kind="after")
    assert list(AuditEvent.objects.values_list("kind", flat=True)) == ["kept", "after"]
    assert list(audit_verify()) == []
