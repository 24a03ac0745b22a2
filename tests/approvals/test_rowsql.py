"""The written-out statements read and write rows exactly as the ORM does."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from approvals.actors import Actor
from approvals.models import Approval, Approver
from approvals.rowsql import insert, save_fields, select_first, select_first_at, update
from recovery.models import Provider
from tests.conftest import PARAMS

pytestmark = pytest.mark.django_db

ALICE = Actor("user", "7", "alice")


def _approval(key: str, **fields: object) -> Approval:
    return Approval(
        operation_key=key,
        action="payment.send",
        provider="orders",
        params_digest="sha256:" + "a" * 64,
        requested_by=ALICE,
        **fields,
    )


def test_insert_writes_what_the_orm_reads_back_and_marks_the_objects_saved():
    before = timezone.now()
    approval = _approval("op-1")
    insert([approval])
    assert approval._state.adding is False
    assert before <= approval.created_at <= timezone.now()  # auto_now_add applied
    stored = Approval.objects.get(pk=approval.pk)
    assert stored.requested_by == ALICE
    assert stored.created_at == approval.created_at
    assert stored.status == Approval.Status.PENDING


def test_insert_of_many_rows_reads_back_each_database_made_key_in_order():
    approvers = [Approver(name=f"phone-{n}", token_hash=f"sha256:{n}", providers=[]) for n in "abc"]
    insert(approvers)
    assert all(approver.pk for approver in approvers)
    assert [Approver.objects.get(pk=a.pk).name for a in approvers] == [
        "phone-a",
        "phone-b",
        "phone-c",
    ]


def test_insert_refused_by_a_constraint_raises_integrity_error_and_writes_nothing():
    first = _approval("op-1")
    insert([first])
    again = _approval("op-2", id=first.id)
    with pytest.raises(IntegrityError), transaction.atomic():
        insert([again])
    assert not Approval.objects.filter(operation_key="op-2").exists()


def test_select_first_converts_like_the_orm():
    approval = _approval("op-1")
    insert([approval])
    found = select_first(Approval, operation_key="op-1", status=Approval.Status.PENDING)
    assert found is not None
    orm = Approval.objects.filter(operation_key="op-1").first()
    assert orm is not None
    assert {f.attname: getattr(found, f.attname) for f in Approval._meta.concrete_fields} == {
        f.attname: getattr(orm, f.attname) for f in Approval._meta.concrete_fields
    }
    assert isinstance(found.id, uuid.UUID) and found.requested_by == ALICE
    assert found.created_at.tzinfo is not None
    assert select_first(Approval, operation_key="op-1", status=Approval.Status.DENIED) is None


def test_none_in_a_condition_means_is_null_as_in_filter():
    insert([_approval("op-1")])
    assert select_first(Approval, operation_key="op-1", decided_at=None) is not None
    undecided = {"operation_key": "op-1", "decided_at": None}
    decided = {"decided_at": timezone.now(), "decided_by": ALICE}
    assert update(Approval, where=undecided, values=decided) == 1
    assert select_first(Approval, **undecided) is None
    assert update(Approval, where=undecided, values=decided) == 0


def test_update_changes_only_the_rows_it_names_and_counts_them():
    for key in ("op-1", "op-2"):
        insert([_approval(key)])
    decided = timezone.now()
    changed = update(
        Approval,
        where={"operation_key": "op-1", "status": Approval.Status.PENDING},
        values={"status": Approval.Status.APPROVED, "decided_by": ALICE, "decided_at": decided},
    )
    assert changed == 1
    assert Approval.objects.get(operation_key="op-1").decided_by == ALICE
    assert Approval.objects.get(operation_key="op-2").status == Approval.Status.PENDING
    # A compare-and-set that no longer holds changes nothing.
    assert (
        update(
            Approval,
            where={"operation_key": "op-1", "status": Approval.Status.PENDING},
            values={"status": Approval.Status.DENIED},
        )
        == 0
    )


def test_update_expressions_are_computed_by_the_database(provider):
    changed = update(
        Provider,
        where={"pk": provider.pk},
        values={},
        expressions={"lease_seconds": '"lease_seconds" * 2'},
    )
    assert changed == 1
    provider.refresh_from_db()
    assert provider.lease_seconds == 120


def test_save_fields_writes_the_named_fields_and_applies_auto_now(provider):
    stamped = provider.updated_at
    provider.lease_seconds = 90
    provider.timeout_seconds = 9  # not named: not written
    save_fields(provider, ["lease_seconds", "updated_at"])
    stored = Provider.objects.get(pk=provider.pk)
    assert stored.lease_seconds == 90 and stored.timeout_seconds == 2
    assert stored.updated_at == provider.updated_at > stamped


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
)
@pytest.mark.django_db(transaction=True)
def test_the_host_api_statements_are_prepared_on_their_connection(flow):
    """The same text on every call: psycopg prepares the hot path's statements."""
    for n in range(6):
        key = f"op-{n}"
        flow.approved(key)
        assert flow.dispatch(key).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("FOR NO KEY UPDATE OF o" in text for text in prepared), prepared
    assert any(text.startswith('INSERT INTO "recovery_auditevent"') for text in prepared)
    # Values travel apart from the text: none of the flow's parameters is in it.
    assert not any(str(PARAMS["to"]) in text for text in prepared)


def test_insert_unless_conflict_skips_a_row_a_partial_unique_index_already_holds():
    """No key read back (the UUID is made here): what went in is the row count."""
    first = _approval("op-1")
    assert insert([first], unless_conflict=True) == 1
    assert first._state.adding is False
    twin = _approval("op-1")  # a second pending approval of the same operation
    assert insert([twin], unless_conflict=True) == 0
    assert twin._state.adding is True  # not saved
    assert Approval.objects.filter(operation_key="op-1").count() == 1
    first.status = Approval.Status.DENIED
    save_fields(first, ["status"])  # outside the index's condition now
    assert insert([twin], unless_conflict=True) == 1


def test_insert_unless_conflict_reads_back_the_key_only_when_the_row_went_in(flow):
    from recovery.models import LookupAttempt, Operation

    flow.register()
    operation = Operation.objects.get(key="op-1")

    def attempt() -> LookupAttempt:
        now = timezone.now()
        return LookupAttempt(
            operation=operation,
            trigger=LookupAttempt.Trigger.RESUME,
            status=LookupAttempt.Status.QUEUED,
            started_at=now,
            lease_expires_at=now,
        )

    first, second = attempt(), attempt()
    assert insert([first], unless_conflict=True) == 1 and first.pk is not None
    assert insert([second], unless_conflict=True) == 0  # one lookup in flight at a time
    assert second.pk is None and second._state.adding is True
    assert LookupAttempt.objects.get().pk == first.pk


def test_select_first_at_reads_the_row_and_the_database_clock_in_one_statement():
    from django.test.utils import CaptureQueriesContext

    approval = _approval("op-1")
    insert([approval])
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        found, now = select_first_at(Approval, operation_key="op-1")
        missing, later = select_first_at(Approval, operation_key="op-2")
    assert len(queries.captured_queries) == 2  # one statement each, the clock included
    assert found is not None and found.pk == approval.pk and found.requested_by == ALICE
    assert missing is None
    assert now.tzinfo is not None and later >= now
    # The database's clock on PostgreSQL: the same as a separate read of it, give or take.
    assert abs((now - before).total_seconds()) < 5
    if connection.vendor == "postgresql":
        assert "statement_timestamp()" in queries.captured_queries[0]["sql"]
