"""An INSERT's values are the ORM's own conversions, whichever way they are reached."""

from __future__ import annotations

import uuid
import warnings
from datetime import datetime
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.db.models import Field, Model
from django.utils import timezone

from approvals.models import Approval, Permit
from audit.models import AuditEvent
from common.actors import Actor
from dbsql import columns
from dbsql.writes import _insert_shape
from recovery.models import Operation, State

pytestmark = pytest.mark.django_db

ALICE = Actor("user", "7", "alice")


def _orm(fields: tuple[Field[Any, Any], ...], obj: Model) -> list[Any]:
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]


def _compared(obj: Model) -> None:
    """``saved_values`` gives what the ORM gives, value for value and type for type; the
    fields the clock fills (``auto_now``) are compared by type only."""
    written, *_ = _insert_shape(type(obj))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a naive datetime, on purpose
        ours, theirs = columns.saved_values(written, obj), _orm(written, obj)
    for field, mine, orm in zip(written, ours, theirs, strict=True):
        assert type(mine) is type(orm), field
        if not (getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)):
            assert getattr(mine, "obj", mine) == getattr(orm, "obj", orm), field  # Jsonb


def test_the_rows_a_lifecycle_writes_are_converted_as_the_orm_converts_them():
    digest = "sha256:" + "a" * 64
    approval = Approval(
        operation_key="op-1",
        action="payment.send",
        provider="orders",
        params_digest=digest,
        requested_by=ALICE,
        decided_at=timezone.now(),
    )
    _compared(approval)
    permit = Permit(
        approval=approval,
        operation_key="op-1",
        action="payment.send",
        provider="orders",
        params_digest=digest,
        issued_at=timezone.now(),
        expires_at=timezone.now(),
    )
    _compared(permit)
    _compared(AuditEvent(seq=1, at=timezone.now(), kind="registered", actor=ALICE, data={"a": 1}))
    _compared(
        Operation(
            key="op-1", action="payment.send", params_canonical="{}", host_id=3, provider_id=4
        )
    )


def test_values_not_of_a_plain_type_take_the_orms_own_conversion():
    # A string in a UUID field, a choice's member, a naive datetime, a bool in an integer
    # field: each as the ORM converts it, not as it came.
    approval = Approval(
        id=str(uuid.uuid4()),  # type: ignore[misc]
        operation_key="op-2",
        action="payment.send",
        provider="orders",
        params_digest="sha256:" + "b" * 64,
        requested_by=ALICE,
        status=Approval.Status.APPROVED,
        decided_at=datetime(2026, 1, 2, 3, 4, 5),  # naive, on purpose
    )
    _compared(approval)
    _compared(AuditEvent(seq=True, at=timezone.now(), kind="x", actor=ALICE, data={}))
    if connection.vendor == "postgresql":
        written, *_ = _insert_shape(Approval)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            values = columns.saved_values(written, approval)
        by_name = dict(zip([f.name for f in written], values, strict=True))
        assert isinstance(by_name["id"], uuid.UUID)
        assert by_name["decided_at"].tzinfo is not None


def test_only_plain_fields_on_postgresql_skip_the_orm():
    """Every other field (JSON, a project's own, a subclass) always takes the ORM's way;
    elsewhere than PostgreSQL, every field does."""
    wrapped = 0
    for model in apps.get_models():
        fields = tuple(model._meta.concrete_fields)
        for field, _, as_is, wrap in columns._save_plan("postgresql", fields):
            target = getattr(field, "target_field", field)
            if wrap is not None:  # an integer field: None as it is, an int wrapped
                assert type(target) in columns._WRAPPED and as_is == (type(None),), field
                wrapped += 1
            elif as_is is not None:
                assert type(target) in columns._AS_IS, field
        assert all(
            as_is is None and wrap is None
            for _, _, as_is, wrap in columns._save_plan("sqlite", fields)
        )
    assert wrapped or connection.vendor != "postgresql"


def test_an_integer_fields_int_is_wrapped_and_a_text_fields_choice_sent_as_the_orm_does():
    """The two conversions a host API request made most, taken without the ORM's way
    on PostgreSQL, to the same values of the same types."""
    member = next(iter(State))  # a TextChoices member: a str subclass
    _compared(AuditEvent(seq=7, at=timezone.now(), kind=member, actor=ALICE))
    operation = Operation(
        key="op-3", action="a", params_canonical="{}", host_id=3, provider_id=4, state=member
    )
    operation.version = 2**40  # more than its column holds: wrapped all the same, as the ORM does
    _compared(operation)
    for model, name, value in ((Operation, "state", member), (AuditEvent, "seq", 7)):
        sent = columns.prep(model, name, value)
        orm = model._meta.get_field(name).get_db_prep_save(value, connection)
        assert type(sent) is type(orm) and sent == orm
