"""What ``dbsql.rows`` and ``dbsql.writes`` both build their statements from: a model's
columns by field name, quoted, and the shape of equality conditions."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeAlias

from django.db import connection, models
from django.db.models import Field, Model

from dbsql.cursor import default_connection, vendor

PLAIN = (int, str, bool)

# Fields whose conversion for saving (``get_db_prep_save``) hands PostgreSQL a value of
# these exact types as it is: ``to_python`` and the backend's ``adapt_*`` are the
# identity for them there (an aware datetime: a naive one is warned of and made aware;
# tests/dbsql/test_columns.py holds the two ways equal). A text field's value is any
# ``str``, a subclass included (a ``TextChoices`` member): its ``to_python`` gives it back.
# A value of any other type, a subclass included, and every other field, a subclass of
# these included, take the ORM's own conversion; but an integer field's ``int``, which
# the backend wraps in the class its ``integerfield_type_map`` names (psycopg's ``Int4``,
# ``Int8``...), is wrapped here the same (``_save_plan``).
_TEXT = (str, type(None))
_AS_IS: dict[type[Field[Any, Any]], tuple[type, ...]] = {
    **dict.fromkeys(
        (
            models.CharField,
            models.TextField,
            models.SlugField,
            models.EmailField,
            models.URLField,
        ),
        _TEXT,
    ),
    # Keys only: an integer field's value is sized for psycopg (``Int4``) by the backend.
    **dict.fromkeys(
        (models.AutoField, models.BigAutoField, models.SmallAutoField), (int, type(None))
    ),
    models.BooleanField: (bool,),
    models.UUIDField: (uuid.UUID, type(None)),
    models.DateTimeField: (datetime, type(None)),
}


@functools.cache
def quote(name: str) -> str:
    """``name`` quoted for the database; asked for each column of each statement built,
    so kept: a process has one database, and a name's quoting never changes."""
    return str(connection.ops.quote_name(name))


def field(model: type[Model], name: str) -> Field[Any, Any]:
    found = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(found, Field), f"{name} is a column of {model.__name__}"
    return found


def column(model: type[Model], name: str) -> str:
    return str(field(model, name).column)


def attname(model: type[Model], name: str) -> str:
    """The attribute that holds the column's value (``evidence_id`` for ``evidence``)."""
    return field(model, name).attname


def prep(model: type[Model], name: str, value: Any) -> Any:
    """``value`` as a condition on column ``name`` sends it: ``get_db_prep_save``'s, the
    common types taken as they are where that is what it gives (``_AS_IS``)."""
    each, as_is, wrap = _prep_plan(model, name)
    if _as_is(value, as_is):
        return value
    if wrap is not None and type(value) is int:
        return wrap(value)
    return each.get_db_prep_save(value, default_connection())


@functools.cache
def _prep_plan(model: type[Model], name: str) -> tuple[Field[Any, Any], Any, Any]:
    """``prep``'s field, and its ``_save_plan``: kept by model and name, whose key costs
    less to hash than the field's (a method of Python's, on every condition)."""
    ((each, _, as_is, wrap),) = _save_plan(vendor(), (field(model, name),))
    return each, as_is, wrap


def _as_is(value: Any, types: tuple[type, ...] | None) -> bool:
    """Whether ``value`` is saved as it is (``_save_plan``'s types for its field)."""
    if types is None:
        return False
    kind = type(value)
    if kind in types:
        return kind is not datetime or value.tzinfo is not None
    return types is _TEXT and isinstance(value, str)


Plan: TypeAlias = "tuple[tuple[Field[Any, Any], str, tuple[type, ...] | None, Any], ...]"

# Integer fields whose ``int`` the backend wraps (``adapt_integerfield_value``).
_WRAPPED = (
    models.SmallIntegerField,
    models.IntegerField,
    models.BigIntegerField,
    models.PositiveSmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
)


@functools.cache
def _save_plan(vendor: str, fields: tuple[Field[Any, Any], ...]) -> Plan:
    """Each field, its attribute, the value types it saves as they are (``_AS_IS``, on
    PostgreSQL; None: the ORM's ``pre_save`` and conversion every time), and the class
    that wraps its ``int`` as the backend does (None: not an integer field's)."""
    types = getattr(connection.ops, "integerfield_type_map", {})  # psycopg 3's, on PostgreSQL
    plan = []
    for each in fields:
        target = each.target_field if isinstance(each, models.ForeignKey) else each
        as_is = _AS_IS.get(type(target)) if vendor == "postgresql" else None
        wrap = None
        if vendor == "postgresql" and type(target) in _WRAPPED:
            wrap = types.get(target.get_internal_type())
            as_is = (type(None),) if wrap is not None else None
        if getattr(each, "auto_now", False) or getattr(each, "auto_now_add", False):
            as_is = None  # pre_save sets the clock's value
        plan.append((each, each.attname, as_is, wrap))
    return tuple(plan)


def save_plan(fields: Sequence[Field[Any, Any]]) -> Plan:
    """``fields``' plan for ``plan_values``: to keep where the same fields are saved
    again and again (``dbsql.writes`` keeps one a model), so that no field is hashed
    to find it (``Field.__hash__`` is a method of Python's)."""
    return _save_plan(vendor(), tuple(fields))


def saved_values(fields: Sequence[Field[Any, Any]], obj: Model) -> list[Any]:
    """``obj``'s values for ``fields`` as an INSERT writes them: what each field's
    ``pre_save`` (for a new row) and ``get_db_prep_save`` give, the common types taken
    as they are where that is what those give (``_AS_IS``)."""
    return plan_values(save_plan(fields), obj)


def plan_values(plan: Plan, obj: Model) -> list[Any]:
    """``saved_values`` for the fields of ``plan`` (``save_plan``'s)."""
    db = None  # looked up once, and only for a value the ORM converts
    values = []
    for each, name, as_is, wrap in plan:
        if as_is is None:
            value = each.pre_save(obj, True)
        else:
            value = getattr(obj, name)  # what pre_save gives a field with no clock
            if _as_is(value, as_is):
                values.append(value)
                continue
            if wrap is not None and type(value) is int:
                values.append(wrap(value))
                continue
        if db is None:
            db = default_connection()
        values.append(each.get_db_prep_save(value, db))
    return values


Shape = tuple[tuple[str, bool], ...]  # conditions: (field name, whether it IS NULL)


def where_shape(model: type[Model], where: Mapping[str, Any]) -> tuple[Shape, list[Any]]:
    """Equality conditions as ``filter()`` reads them (``None`` is ``IS NULL``): their
    shape, which names the statement's text, and their parameters."""
    shape = tuple((name, value is None) for name, value in where.items())
    params = [prep(model, name, value) for name, value in where.items() if value is not None]
    return shape, params


def conditions(model: type[Model], shape: Shape) -> str:
    return " AND ".join(
        f"{quote(column(model, name))} {'IS NULL' if null else '= %s'}" for name, null in shape
    )
