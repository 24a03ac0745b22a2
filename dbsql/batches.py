"""Batches written out: many rows, each with values of its own, in one statement.

The same discipline as ``dbsql.writes``: one text per model and shape, kept.

values_update
    ``UPDATE … FROM (VALUES …)``: many rows in one statement (PostgreSQL), still a
    compare-and-set per row when asked.
bulk_save
    ``save(update_fields=…)`` for many rows in one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from dbsql import columns
from dbsql.cursor import kept_cursor, vendor


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

    ``UPDATE t SET … FROM (VALUES (…), (…)) AS v(…) WHERE t.id = v.id [AND t.col = v.old]
    RETURNING t.id``. ``values``: the VALUES columns as (alias, model field whose column
    type and conversion the value takes); the first is matched with ``match``, a unique
    field. ``assign``: model field → SQL expression over ``t`` (the row) and ``v`` (its
    values). ``expect``: model field → alias of the value the row must still hold, or it
    is left alone (and not returned). Django's ``bulk_update`` says the same with a
    ``CASE WHEN`` per column and row, which costs more to build in Python than the rest
    of a batch's work.
    """
    assert vendor() == "postgresql", "one statement per batch needs PostgreSQL"
    if not rows:
        return set()
    fields, sql = _values_update_sql(
        model,
        tuple(values),
        tuple(assign.items()),
        tuple((expect or {}).items()),
        match,
        len(rows),
    )
    params: list[Any] = []
    for row in rows:
        assert len(row) == len(fields), "one value per column"
        params += [
            # Plain values need no conversion: asking each field costs more than the
            # rest of the statement for a large batch.
            value
            if value is None or type(value) in columns.PLAIN
            else field.get_db_prep_save(value, connection)
            for field, value in zip(fields, row, strict=True)
        ]
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


@functools.lru_cache(maxsize=256)
def _values_update_sql(
    model: type[Model],
    values: tuple[tuple[str, str], ...],
    assign: tuple[tuple[str, str], ...],
    expect: tuple[tuple[str, str], ...],
    match: str,
    count: int,
) -> tuple[tuple[Field[Any, Any], ...], str]:
    """``values_update``'s fields and text for one shape and number of rows, kept."""
    meta = model._meta
    fields = tuple(columns.field(model, name) for _, name in values)
    casts = ", ".join(f"%s::{field.db_type(connection)}" for field in fields)
    key = columns.quote(columns.column(model, meta.pk.name if match == "pk" else match))
    aliases = ", ".join(columns.quote(alias) for alias, _ in values)
    sets = ", ".join(
        f"{columns.quote(columns.column(model, name))} = {sql}" for name, sql in assign
    )
    where = [f"t.{key} = v.{columns.quote(values[0][0])}"]
    where += [
        f"t.{columns.quote(columns.column(model, name))} = v.{columns.quote(alias)}"
        for name, alias in expect
    ]
    sql = (
        f"UPDATE {columns.quote(meta.db_table)} AS t SET {sets} "
        f"FROM (VALUES {', '.join([f'({casts})'] * count)}) AS v({aliases}) "
        f"WHERE {' AND '.join(where)} RETURNING t.{key}"
    )
    return fields, sql


def bulk_save(objects: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of each of ``objects`` (one model) in one statement.

    ``Model.save(update_fields=…)`` for many rows: ``values_update`` on PostgreSQL,
    ``bulk_update`` elsewhere (SQLite, the embedded default, has one writer at a time).
    """
    if not objects:
        return
    model = type(objects[0])
    if vendor() != "postgresql":
        model._default_manager.bulk_update(objects, fields)
        return
    names = [columns.attname(model, name) for name in fields]
    values_update(
        model,
        values=[("pk", model._meta.pk.name), *zip(names, fields, strict=True)],
        rows=[[obj.pk, *(getattr(obj, name) for name in names)] for obj in objects],
        assign={
            name: f"v.{columns.quote(attname)}" for name, attname in zip(fields, names, strict=True)
        },
    )
