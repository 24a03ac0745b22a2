"""The written-out statements read and write rows exactly as the ORM does."""

from __future__ import annotations

import functools
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Field
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Approval, Approver
from common.actors import Actor
from dbsql.batches import bulk_save, values_update
from dbsql.rows import (
    model_from_row,
    select_first,
    select_first_at,
    select_locked_with,
    values_from_rows,
)
from dbsql.writes import (
    NOW,
    insert,
    insert_naming,
    save_fields,
    update,
    update_returning,
)
from recovery.models import Host, Operation, OperationClaim, Provider, State
from tests.support.flow import PARAMS

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


def _operation(host: Host, key: str) -> Operation:
    return Operation(
        key=key,
        host=host,
        action="payment.send",
        params_canonical="{}",
        params_digest="sha256:" + "b" * 64,
        state=State.AWAITING_APPROVAL,
    )


def test_insert_naming_finds_the_row_named_and_inserts_pointing_at_it(host, provider):
    operation = _operation(host, "op-1")
    with CaptureQueriesContext(connection) as queries:
        found = insert_naming(operation, "provider", name="orders")
    assert found is not None and found.pk == provider.pk
    assert (found.lease_seconds, found.adapter) == (60, "sqlite")  # the row as stored
    assert operation.provider is found and operation.pk and not operation._state.adding
    stored = Operation.objects.select_related("provider").get(key="op-1")
    assert (stored.pk, stored.provider.name) == (operation.pk, "orders")
    assert stored.created_at == operation.created_at
    # One round trip on PostgreSQL; a SELECT, then the INSERT, on SQLite.
    assert len(queries.captured_queries) == (1 if connection.vendor == "postgresql" else 2)


def test_insert_naming_a_row_that_is_not_there_inserts_nothing(host, provider):
    operation = _operation(host, "op-1")
    assert insert_naming(operation, "provider", name="nobody") is None
    assert operation.pk is None and operation._state.adding
    assert not Operation.objects.exists()


def test_insert_naming_raises_what_the_insert_raises(host, provider):
    insert_naming(_operation(host, "op-1"), "provider", name="orders")
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_naming(_operation(host, "op-1"), "provider", name="orders")
    assert Operation.objects.count() == 1


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
    assert any("FOR NO KEY UPDATE OF t" in text for text in prepared), prepared
    assert any(text.startswith('INSERT INTO "audit_auditevent"') for text in prepared)
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


# -- select_locked_with, model_from_row --------------------------------------------------


def _row_locked_now(table: str, pk: object) -> bool:
    """Whether the row's current version is locked (PostgreSQL: its xmax is set)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT xmax::text <> '0' FROM {table} WHERE id = %s", [pk])
        return bool(cursor.fetchone()[0])


def test_select_locked_with_reads_the_row_and_its_related_row_in_one_statement(flow):
    from django.test.utils import CaptureQueriesContext

    from recovery.models import Operation

    flow.register()
    orm = Operation.objects.select_related("provider").get(key="op-1")
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        found = select_locked_with(Operation, "provider", where="t.key = %s", params=["op-1"])
        assert found is not None
        assert found.provider == orm.provider and found.provider.name == "orders"
        assert {f.attname: getattr(found, f.attname) for f in Operation._meta.concrete_fields} == {
            f.attname: getattr(orm, f.attname) for f in Operation._meta.concrete_fields
        }
        missing = select_locked_with(Operation, "provider", where="t.key = %s", params=["op-2"])
        assert missing is None
        if connection.vendor == "postgresql":
            # The operation's row is locked, without its key; its provider's is not.
            assert _row_locked_now("recovery_operation", found.pk)
            assert not _row_locked_now("recovery_provider", found.provider.pk)
    statements = [query["sql"] for query in queries.captured_queries]
    reads = [s for s in statements if "xmax" not in s]
    assert len(reads) == 2 and all(s.startswith("SELECT t.") for s in reads)  # provider cached
    if connection.vendor == "postgresql":
        assert statements[0].endswith("FOR NO KEY UPDATE OF t")


def test_select_locked_with_conditions_may_name_the_related_row(flow):
    from recovery.models import Operation

    flow.register()
    by_name = "r.name = %s AND t.key = %s"
    assert select_locked_with(Operation, "provider", where=by_name, params=["nope", "op-1"]) is None
    found = select_locked_with(Operation, "provider", where=by_name, params=["orders", "op-1"])
    assert found is not None and found.key == "op-1"


def _approval_row() -> tuple[list[Field], tuple[object, ...]]:
    """An approval inserted, and its row as the database holds it, every column."""
    insert([_approval("op-1")])
    fields = Approval._meta.concrete_fields
    columns = ", ".join(f'"{field.column}"' for field in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM approvals_approval")
        return fields, cursor.fetchone()


def test_model_from_row_converts_a_raw_row_as_the_orm_does():
    fields, row = _approval_row()
    made = model_from_row(Approval, fields, row)
    assert made._state.adding is False and made._state.db == connection.alias
    assert made.requested_by == ALICE and isinstance(made.id, uuid.UUID)
    orm = Approval.objects.get()
    assert {f.attname: getattr(made, f.attname) for f in fields} == {
        f.attname: getattr(orm, f.attname) for f in fields
    }


def test_model_from_row_makes_the_instance_from_db_makes_and_hooks_see_it(monkeypatch):
    """Without ``Model.__init__``'s work where nothing hooks it: the same ``__dict__``,
    the fields left out deferred; a model with a ``post_init`` receiver, by ``from_db``."""
    from django.db.models.signals import post_init

    from dbsql import rows

    fields, row = _approval_row()
    made = model_from_row(Approval, fields, row)
    orm = Approval.objects.get()
    assert made.__dict__.keys() == orm.__dict__.keys()
    assert made._state.__dict__ == orm._state.__dict__ == {"adding": False, "db": "default"}
    assert made == orm and made.pk == orm.pk
    some = [field for field in fields if field.name in {"id", "operation_key", "status"}]
    partial = model_from_row(Approval, some, [row[fields.index(field)] for field in some])
    assert (
        partial.get_deferred_fields()
        == orm.__class__.objects.only("id", "operation_key", "status").get().get_deferred_fields()
    )
    assert partial.requested_by == ALICE  # loaded when read, as a deferred field is
    with pytest.raises(ValueError, match="values for"):
        model_from_row(Approval, fields, row[:-1])

    seen: list[object] = []

    def hook(sender: object, instance: object, **kwargs: object) -> None:
        seen.append(instance)

    post_init.connect(hook, sender=Approval)
    monkeypatch.setattr(rows, "_plain", functools.cache(rows._plain.__wrapped__))
    try:
        hooked = model_from_row(Approval, fields, row)
    finally:
        post_init.disconnect(hook, sender=Approval)
    assert seen == [hooked] and hooked == orm


def test_model_unsaved_is_the_instance_the_constructor_makes():
    from dbsql.rows import model_unsaved

    values = {
        f.attname: getattr(_approval("op-2"), f.attname) for f in Approval._meta.concrete_fields
    }
    made, constructed = model_unsaved(Approval, **values), Approval(**values)
    assert made.__dict__.keys() == constructed.__dict__.keys()
    assert {k: v for k, v in made.__dict__.items() if k != "_state"} == {
        k: v for k, v in constructed.__dict__.items() if k != "_state"
    }
    assert made._state.adding is True and made._state.db is None
    del values["decision_reason"]  # a field left out: the constructor's default
    assert model_unsaved(Approval, **values).decision_reason == ""


def _fields(instance: object) -> dict[str, object]:
    return {k: v for k, v in vars(instance).items() if k != "_state"}


def test_model_unsaved_sets_a_relation_by_name_and_defaults_the_rest_as_the_constructor():
    from approvals.models import Permit
    from dbsql.rows import model_unsaved

    approval = _approval("op-3")
    given = {"approval": approval, "operation_key": "op-3", "action": "payment.send"}
    constructed = Permit(**given)
    made = model_unsaved(Permit, **given)  # the later: the approval's side points to it
    # Every field, defaults included; the permit's id a fresh default on each.
    assert made.id != constructed.id
    made.id = constructed.id
    assert _fields(made) == _fields(constructed)
    assert made.approval_id == approval.pk
    # The related object kept as the constructor keeps it (no query to read it), and
    # the one-to-one's other side pointing back.
    with CaptureQueriesContext(connection) as queries:
        assert made.approval is approval and approval.permit is made
    assert len(queries) == 0
    assert made._state.adding is True and made._state.db == constructed._state.db


def test_model_unsaved_leaves_what_is_not_a_concrete_field_to_the_constructor():
    from dbsql.rows import model_unsaved

    with pytest.raises(TypeError, match="unexpected keyword"):
        model_unsaved(Approval, operation_key="op-4", no_such_field=1)


# -- update_returning --------------------------------------------------------------------


def test_update_returning_is_a_compare_and_set_that_reads_the_clock():
    from django.test.utils import CaptureQueriesContext

    approval = _approval("op-1")
    insert([approval])
    table = '"approvals_approval"'
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        row = update_returning(
            table,
            '"status" = %s, "decided_at" = {now}',
            '"id" = %s AND "status" = %s AND "created_at" <= {now}',
            [
                Approval.Status.APPROVED,
                NOW,
                Approval._meta.pk.get_db_prep_value(approval.id, connection),
                Approval.Status.PENDING,
                NOW,
            ],
            ["status", "decided_at"],
        )
    assert len(queries.captured_queries) == 1
    assert row is not None and row[0] == Approval.Status.APPROVED
    stored = Approval.objects.get()
    assert stored.status == Approval.Status.APPROVED
    assert stored.decided_at is not None and abs((stored.decided_at - before).total_seconds()) < 5
    if connection.vendor == "postgresql":
        assert queries.captured_queries[0]["sql"].count("statement_timestamp()") == 2
    # The condition no longer holds: nothing changed, nothing returned.
    again = update_returning(
        table,
        '"status" = %s',
        '"operation_key" = %s AND "status" = %s',
        [Approval.Status.DENIED, "op-1", Approval.Status.PENDING],
        ["status"],
    )
    assert again is None
    assert Approval.objects.get().status == Approval.Status.APPROVED


# -- batches: values_update, bulk_save ------------------------------------------------


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement needs PostgreSQL")
def test_values_update_writes_each_row_its_own_values_in_one_statement():
    from django.test.utils import CaptureQueriesContext

    approvals = [_approval(f"op-{n}") for n in range(3)]
    insert(approvals)
    with CaptureQueriesContext(connection) as queries:
        changed = values_update(
            Approval,
            values=[("pk", "id"), ("new", "status"), ("old", "status")],
            rows=[
                [approvals[0].id, Approval.Status.APPROVED, Approval.Status.PENDING],
                [approvals[1].id, Approval.Status.DENIED, Approval.Status.PENDING],
                # Its row no longer holds the expected value: left alone, not returned.
                [approvals[2].id, Approval.Status.DENIED, Approval.Status.APPROVED],
            ],
            assign={"status": "v.new"},
            expect={"status": "old"},
        )
    assert len(queries.captured_queries) == 1
    assert changed == {approvals[0].id, approvals[1].id}
    stored = dict(Approval.objects.values_list("operation_key", "status"))
    assert stored == {"op-0": "approved", "op-1": "denied", "op-2": "pending"}
    assert values_update(Approval, values=[("pk", "id")], rows=[], assign={}) == set()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement needs PostgreSQL")
def test_values_update_builds_its_text_once_per_shape(monkeypatch):
    """Each operation's transition is a ``values_update`` of one row: its text is built
    (each column's type asked) the first time a shape is met, then kept."""
    approvals = [_approval(f"op-{n}") for n in range(3)]
    insert(approvals)
    asked: list[str] = []
    db_type = Field.db_type
    monkeypatch.setattr(Field, "db_type", lambda f, c: asked.append(f.name) or db_type(f, c))

    def approve(approval: Approval, rows: int = 1) -> None:
        values_update(
            Approval,
            values=[("pk", "id"), ("new", "status"), ("old", "status"), ("why", "decision_reason")],
            rows=[[approval.id, Approval.Status.APPROVED, Approval.Status.PENDING, "a"]] * rows,
            assign={"status": "v.new", "decision_reason": "v.why"},
            expect={"status": "old"},
        )

    approve(approvals[0])
    first = len(asked)
    approve(approvals[1])
    assert len(asked) == first  # the same shape: the text kept
    approve(approvals[2], rows=2)
    assert len(asked) > first  # another number of rows: another text
    assert set(Approval.objects.values_list("status", flat=True)) == {"approved"}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement needs PostgreSQL")
def test_values_update_matches_on_another_unique_field_and_converts_values():
    approvals = [_approval(f"op-{n}") for n in range(2)]
    insert(approvals)
    decided = timezone.now()
    changed = values_update(
        Approval,
        values=[("id", "id"), ("at", "decided_at"), ("by", "decided_by")],
        rows=[[approvals[0].id, decided, ALICE]],
        assign={"decided_at": "v.at", "decided_by": "v.by"},
        match="id",
    )
    assert changed == {approvals[0].id}
    first, second = Approval.objects.order_by("operation_key")
    assert first.decided_at == decided and first.decided_by == ALICE
    assert second.decided_at is None


def test_bulk_save_writes_the_named_fields_of_every_object():
    from django.test.utils import CaptureQueriesContext

    approvals = [_approval(f"op-{n}") for n in range(3)]
    insert(approvals)
    for n, approval in enumerate(approvals):
        approval.status = Approval.Status.APPROVED if n % 2 else Approval.Status.DENIED
        approval.decided_by = ALICE
        approval.host = "not-written"
    with CaptureQueriesContext(connection) as queries:
        bulk_save(approvals, ["status", "decided_by"])
    assert len(queries.captured_queries) == 1
    stored = {a.operation_key: a for a in Approval.objects.all()}
    assert [stored[f"op-{n}"].status for n in range(3)] == ["denied", "approved", "denied"]
    assert all(a.decided_by == ALICE and a.host == "" for a in stored.values())
    with CaptureQueriesContext(connection) as queries:
        bulk_save([], ["status"])
    assert queries.captured_queries == []


def test_values_from_rows_converts_each_column_as_its_fields_column():
    """Columns of several models in one row: an ActorField's text becomes an Actor, the
    rest stay as they came; NULLs go through the converters as the ORM sends them."""
    fields = (Operation._meta.get_field("key"), OperationClaim._meta.get_field("actor"))
    rows = values_from_rows(fields, [("op-1", "user:olivia"), ("op-2", None)])
    assert rows == [["op-1", Actor.parse("user:olivia")], ["op-2", None]]
