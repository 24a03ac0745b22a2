"""Writing many rows, each with values of its own, in one statement.

values update
    ``UPDATE t SET … FROM (VALUES (…), (…)) AS v(…) WHERE t.id = v.id [AND t.col = v.old]
    RETURNING t.id`` (PostgreSQL): one statement for a batch, however large, and still a
    compare-and-set per row when ``expect`` names columns the row must still hold. The
    rows it did not change are simply not returned.

Django's ``bulk_update`` says the same with a ``CASE WHEN`` per column and row, which
costs more to build in Python than the rest of a batch's work; on SQLite (the embedded
default, one writer at a time) ``bulk_save`` falls back to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model

_PLAIN = (int, str, bool)


def values_update(
    model: type[Model],
    *,
    values: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
    assign: Mapping[str, str],
    expect: Mapping[str, str] | None = None,
    match: str = "pk",
) -> set[Any]:
    """Update ``rows`` of ``model`` in one statement (PostgreSQL); the ``match`` values changed.

    ``values``: the VALUES columns as (alias, model field whose column type and
    conversion the value takes); the first is matched with ``match``, a unique field.
    ``assign``: model field → SQL expression over ``t`` (the row) and ``v`` (its values).
    ``expect``: model field → alias of the value the row must still hold, or it is left
    alone (and not returned).
    """
    assert connection.vendor == "postgresql", "one statement per batch needs PostgreSQL"
    if not rows:
        return set()
    meta = model._meta
    fields = [_field(model, name) for _, name in values]
    casts = ", ".join(f"%s::{field.db_type(connection)}" for field in fields)
    params: list[Any] = []
    for row in rows:
        assert len(row) == len(fields), "one value per column"
        params += [
            # Plain values need no conversion: asking each field costs more than the
            # rest of the statement for a large batch.
            value
            if value is None or type(value) in _PLAIN
            else field.get_db_prep_save(value, connection)
            for field, value in zip(fields, row, strict=True)
        ]
    quote = connection.ops.quote_name
    key = quote(_column(model, meta.pk.name if match == "pk" else match))
    aliases = ", ".join(quote(alias) for alias, _ in values)
    sets = ", ".join(f"{quote(_column(model, name))} = {sql}" for name, sql in assign.items())
    where = [f"t.{key} = v.{quote(values[0][0])}"]
    where += [
        f"t.{quote(_column(model, name))} = v.{quote(alias)}"
        for name, alias in (expect or {}).items()
    ]
    sql = (
        f"UPDATE {quote(meta.db_table)} AS t SET {sets} "
        f"FROM (VALUES {', '.join([f'({casts})'] * len(rows))}) AS v({aliases}) "
        f"WHERE {' AND '.join(where)} RETURNING t.{key}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def bulk_save(objects: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of each of ``objects`` (one model) in one statement.

    ``Model.save(update_fields=…)`` for many rows: ``values_update`` on PostgreSQL,
    ``bulk_update`` elsewhere.
    """
    if not objects:
        return
    model = type(objects[0])
    if connection.vendor != "postgresql":
        model._default_manager.bulk_update(objects, fields)
        return
    names = [_attname(model, name) for name in fields]
    values_update(
        model,
        values=[("pk", model._meta.pk.name), *zip(names, fields, strict=True)],
        rows=[[obj.pk, *(getattr(obj, name) for name in names)] for obj in objects],
        assign={
            name: f"v.{connection.ops.quote_name(attname)}"
            for name, attname in zip(fields, names, strict=True)
        },
    )


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    found = model._meta.get_field(name)
    assert isinstance(found, Field), f"{name} is a column of {model.__name__}"
    return found


def _column(model: type[Model], name: str) -> str:
    return str(_field(model, name).column)


def _attname(model: type[Model], name: str) -> str:
    """The attribute that holds the column's value (``evidence_id`` for ``evidence``)."""
    return _field(model, name).attname
