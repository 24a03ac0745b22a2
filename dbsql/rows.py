"""Statements written out instead of built by the ORM: the host API's path, and batches.

Every host-API call runs six to eight statements. Building each through the ORM (a
queryset, its compiler, the model's save machinery) cost the web worker more CPU than
PostgreSQL spent running it; so the statements of that path are written here, each
text built once per model and shape and kept, and the rows go in and out converted
exactly as the ORM converts them (``get_db_prep_save`` on the way in, the backend's and
the field's converters on the way out). Only equality conditions and plain
assignments: anything richer stays with the ORM.

One text per shape also means the same text on every call, which is what lets psycopg
prepare it on its connection (see ``SETTLE_DB_PREPARED_STATEMENTS`` in the settings).

select_first
    ``filter(a=…, b=…).first()`` (``None`` is ``IS NULL``, as there).
select_first_at
    ``select_first`` and the database's clock, read by the same statement.
select_locked_with
    ``select_for_update(of=("self",), no_key=True).select_related(one)``: a row and the
    row one of its foreign keys points at, the first locked, in one statement.
insert
    ``save(force_insert=True)`` / ``bulk_create`` for instances of one model: one INSERT,
    ``auto_now_add`` and ``auto_now`` applied, database-made primary keys read back;
    or, for one row, ``INSERT … ON CONFLICT DO NOTHING``.
update
    ``filter(…).update(…)``: equality conditions, values or SQL expressions assigned;
    the number of rows changed.
update_returning
    A compare-and-set that also reads the database's clock (``NOW``).
model_from_row
    A model instance from a raw row, converted as the ORM converts.
values_from_rows
    Raw rows' values, each converted as the ORM converts its field (of any model).
values_update
    ``UPDATE … FROM (VALUES …)``: many rows, each with values of its own, in one
    statement (PostgreSQL), still a compare-and-set per row when asked.
bulk_save
    ``save(update_fields=…)`` for many rows in one statement.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

from dbsql.clock import clock

M = TypeVar("M", bound=Model)

_PLAIN = (int, str, bool)
NOW = object()  # a parameter of ``update_returning``: the database's clock goes here


def _quote(name: str) -> str:
    return str(connection.ops.quote_name(name))


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    found = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(found, Field), f"{name} is a column of {model.__name__}"
    return found


def _column(model: type[Model], name: str) -> str:
    return str(_field(model, name).column)


def _attname(model: type[Model], name: str) -> str:
    """The attribute that holds the column's value (``evidence_id`` for ``evidence``)."""
    return _field(model, name).attname


def _prep(model: type[Model], name: str, value: Any) -> Any:
    return _field(model, name).get_db_prep_save(value, connection)


# -- reading -----------------------------------------------------------------------------


@functools.cache
def _converters(
    vendor: str, model: type[Model], fields: tuple[Field[Any, Any], ...]
) -> tuple[tuple[Callable[..., Any], ...], ...]:
    del vendor  # part of the key only: the backend decides the converters
    converters = []
    for field in fields:
        column = field.get_col(model._meta.db_table)
        converters.append(
            (
                column,
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            )
        )
    return tuple(converters)


def model_from_row(model: type[M], fields: Sequence[Any], row: Sequence[Any]) -> M:
    """A model instance from a raw row, converted the way Django's own queries convert."""
    values = []
    for (column, *converters), value in zip(
        _converters(connection.vendor, model, tuple(fields)), row, strict=True
    ):
        for converter in converters:
            value = converter(value, column, connection)
        values.append(value)
    return model.from_db(connection.alias, [field.attname for field in fields], values)


@functools.cache
def _field_converters(
    vendor: str, fields: tuple[Field[Any, Any], ...]
) -> tuple[tuple[Callable[..., Any], ...], ...]:
    """``_converters`` for fields of any models, each converted as its own column."""
    del vendor  # part of the key only: the backend decides the converters
    converters = []
    for field in fields:
        column = field.get_col(field.model._meta.db_table)
        converters.append(
            (
                column,
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            )
        )
    return tuple(converters)


def values_from_rows(
    fields: tuple[Field[Any, Any], ...], rows: Sequence[Sequence[Any]]
) -> list[list[Any]]:
    """``rows``' values, each converted as the ORM converts a column of ``fields``' one.

    For a statement whose columns come from several tables (or from subqueries that
    read one column each): what ``model_from_row`` does for one model's row. The
    converters are looked up once for all the rows, and only the columns that have
    any are touched (on PostgreSQL, few do).
    """
    converted = [
        (index, column, converters)
        for index, (column, *converters) in enumerate(_field_converters(connection.vendor, fields))
        if converters
    ]
    values = [list(row) for row in rows]
    for row in values:
        for index, column, converters in converted:
            value = row[index]
            for converter in converters:
                value = converter(value, column, connection)
            row[index] = value
    return values


@functools.cache
def _columns(model: type[Model]) -> str:
    return ", ".join(_quote(str(field.column)) for field in model._meta.concrete_fields)


Shape = tuple[tuple[str, bool], ...]  # conditions: (field name, whether it IS NULL)


def _where(model: type[Model], where: Mapping[str, Any]) -> tuple[Shape, list[Any]]:
    """Equality conditions as ``filter()`` reads them (``None`` is ``IS NULL``): their
    shape, which names the statement's text, and their parameters."""
    shape = tuple((name, value is None) for name, value in where.items())
    params = [_prep(model, name, value) for name, value in where.items() if value is not None]
    return shape, params


def _conditions(model: type[Model], shape: Shape) -> str:
    return " AND ".join(
        f"{_quote(_column(model, name))} {'IS NULL' if null else '= %s'}" for name, null in shape
    )


@functools.cache
def _select_sql(model: type[Model], shape: Shape) -> str:
    return (
        f"SELECT {_columns(model)} FROM {_quote(model._meta.db_table)} "
        f"WHERE {_conditions(model, shape)} "
        f"ORDER BY {_quote(str(model._meta.pk.column))} LIMIT 1"
    )


def select_first(model: type[M], **where: Any) -> M | None:
    """``model.objects.filter(**where).first()``, equality on columns only."""
    shape, params = _where(model, where)
    with connection.cursor() as cursor:
        cursor.execute(_select_sql(model, shape), params)
        row = cursor.fetchone()
    return None if row is None else model_from_row(model, model._meta.concrete_fields, row)


def select_first_at(model: type[M], **where: Any) -> tuple[M | None, datetime]:
    """``select_first``, and the database's clock read by the same statement.

    So that a lease is judged by the database's clock without a statement of its own;
    where this process's clock stands in (``dbsql.clock``), ``select_first`` and it.
    """
    now = clock()
    if now.local is not None:
        return select_first(model, **where), now.local
    shape, params = _where(model, where)
    with connection.cursor() as cursor:
        cursor.execute(_select_at_sql(model, shape, now.sql), [*now.params, *params])
        at, *row = cursor.fetchone()
    fields = model._meta.concrete_fields
    missing = row[fields.index(model._meta.pk)] is None
    return (None if missing else model_from_row(model, fields, row)), at


@functools.cache
def _select_at_sql(model: type[Model], shape: Shape, clock_sql: str) -> str:
    # One row always: the clock, and the row's columns (NULL when there is none).
    return (
        f"SELECT {clock_sql}, t.* FROM (SELECT 1) clock "
        f"LEFT JOIN ({_select_sql(model, shape)}) t ON TRUE"
    )


@functools.cache
def select_locked_with_sql(model: type[Model], related: str) -> str:
    """``select_locked_with``'s text, ``{where}`` left to fill in (``t``: the row, ``r``:
    the related row); ``FOR NO KEY UPDATE OF t`` where the database has it."""
    target = _field(model, related).related_model
    assert isinstance(target, type) and issubclass(target, Model), f"{related} is a foreign key"
    columns = [f"t.{_quote(str(f.column))}" for f in model._meta.concrete_fields]
    columns += [f"r.{_quote(str(f.column))}" for f in target._meta.concrete_fields]
    lock = " FOR NO KEY UPDATE OF t" if connection.features.has_select_for_update_of else ""
    return (
        f"SELECT {', '.join(columns)} FROM {_quote(model._meta.db_table)} t "
        f"JOIN {_quote(target._meta.db_table)} r "
        f"ON r.{_quote(str(target._meta.pk.column))} = t.{_quote(_column(model, related))} "
        f"WHERE {{where}}{lock}"
    )


def select_locked_with(
    model: type[M], related: str, *, where: str, params: Sequence[Any]
) -> M | None:
    """The one row of ``model`` that ``where`` names, locked, with its ``related`` row.

    ``where`` is SQL over ``t`` (the row) and ``r`` (the row its foreign key ``related``
    points at), with ``%s`` for ``params``. Only the row is locked, never the related
    one, and without its key (``no_key``): inserts that reference it check their foreign
    key freely. The related row is cached on it, as ``select_related`` leaves it.
    """
    with connection.cursor() as cursor:
        cursor.execute(select_locked_with_sql(model, related).format(where=where), params)
        row = cursor.fetchone()
    if row is None:
        return None
    fields = model._meta.concrete_fields
    found = model_from_row(model, fields, row[: len(fields)])
    field = _field(model, related)
    target = field.related_model
    assert isinstance(target, type) and issubclass(target, Model)
    found._state.fields_cache[field.name] = model_from_row(
        target, target._meta.concrete_fields, row[len(fields) :]
    )
    return found


# -- writing -----------------------------------------------------------------------------


@functools.cache
def _insert_shape(
    model: type[Model],
) -> tuple[tuple[Field[Any, Any], ...], str, tuple[Field[Any, Any], ...], str]:
    """The fields an INSERT writes and their columns; the fields the database makes
    (read back) and the RETURNING clause for them."""
    meta = model._meta
    written = tuple(field for field in meta.concrete_fields if not field.db_returning)
    returned = tuple(field for field in meta.concrete_fields if field.db_returning)
    returning = ", ".join(_quote(str(field.column)) for field in returned)
    columns = ", ".join(_quote(str(field.column)) for field in written)
    return written, columns, returned, f" RETURNING {returning}" if returning else ""


def insert(objects: Sequence[Model], *, unless_conflict: bool = False) -> int:
    """Insert ``objects`` (all of one model, not saved yet) in one statement.

    What ``save(force_insert=True)`` and ``bulk_create`` do for them: each field's
    ``pre_save`` (``auto_now_add``), its conversion, and the keys the database makes
    read back into the objects, which are then saved instances. No signals are sent:
    none of Settle's models has a receiver.

    ``unless_conflict`` (one object): ``ON CONFLICT DO NOTHING`` — when a unique
    constraint, a partial one included, already holds a row like it, nothing is
    inserted and the object stays unsaved. Returns the number of rows inserted.
    """
    if not objects:
        return 0
    assert not unless_conflict or len(objects) == 1, "which rows went in is read back for one"
    model = type(objects[0])
    assert all(type(obj) is model for obj in objects), "one model per statement"
    written, columns, returned, returning = _insert_shape(model)
    assert not any(getattr(obj, f.attname) for obj in objects for f in returned), "made by it"
    params: list[Any] = []
    for obj in objects:
        params += [
            field.get_db_prep_save(field.pre_save(obj, True), connection) for field in written
        ]
    row_marks = "(" + ", ".join(["%s"] * len(written)) + ")"
    sql = (
        f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) "
        f"VALUES {', '.join([row_marks] * len(objects))}"
        f"{' ON CONFLICT DO NOTHING' if unless_conflict else ''}{returning}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall() if returning else []
        inserted = len(rows) if returning else cursor.rowcount
    if unless_conflict and not inserted:
        return 0
    for index, obj in enumerate(objects):
        if rows:
            for field, value in zip(returned, rows[index], strict=True):
                setattr(obj, field.attname, value)
        obj._state.adding = False
        obj._state.db = connection.alias
    return inserted


def insert_where(obj: Model, condition: str, params: Sequence[Any]) -> bool:
    """Insert ``obj`` (not saved yet) only if ``condition`` holds, in one statement.

    ``INSERT … SELECT <values> WHERE <condition> RETURNING``: the check and the write are
    one statement, so a caller that holds the lock the condition depends on pays no
    separate read. Returns whether the row went in (then ``obj`` is saved).
    """
    model = type(obj)
    written, columns, returned, returning = _insert_shape(model)
    values = [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in written]
    # PostgreSQL types a SELECT list's parameters on its own: say each column's type.
    casts = [
        f"CAST(%s AS {field.cast_db_type(connection)})"
        if connection.vendor == "postgresql"
        else "%s"
        for field in written
    ]
    sql = (
        f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) "
        f"SELECT {', '.join(casts)} WHERE {condition}{returning}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, *params])
        rows = cursor.fetchall() if returning else []
        inserted = len(rows) if returning else cursor.rowcount
    if not inserted:
        return False
    for field, value in zip(returned, rows[0] if rows else (), strict=False):
        setattr(obj, field.attname, value)
    obj._state.adding = False
    obj._state.db = connection.alias
    return True


@functools.cache
def _update_sql(
    model: type[Model],
    assigned: tuple[str, ...],
    expressions: tuple[tuple[str, str], ...],
    where: Shape,
) -> str:
    sets = [f"{_quote(_column(model, name))} = %s" for name in assigned]
    sets += [f"{_quote(_column(model, name))} = {sql}" for name, sql in expressions]
    return (
        f"UPDATE {_quote(model._meta.db_table)} SET {', '.join(sets)} "
        f"WHERE {_conditions(model, where)}"
    )


def update(
    model: type[Model],
    *,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    expressions: Mapping[str, str] | None = None,
) -> int:
    """``filter(**where).update(**values)``: the number of rows changed.

    ``expressions``: field → SQL over the row's own columns (``"version" + 1``), for
    what ``F()`` would say.
    """
    shape, conditions = _where(model, where)
    sql = _update_sql(model, tuple(values), tuple((expressions or {}).items()), shape)
    params = [_prep(model, name, value) for name, value in values.items()] + conditions
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def save_fields(obj: Model, fields: Sequence[str]) -> None:
    """``obj.save(update_fields=fields)`` for a saved row, written out (``auto_now`` too)."""
    model = type(obj)
    update(
        model,
        where={"pk": obj.pk},
        values={name: _field(model, name).pre_save(obj, False) for name in fields},
    )


def update_returning(
    table: str, assignments: str, where: str, params: list[Any], returning: list[str]
) -> tuple[Any, ...] | None:
    """One conditional UPDATE … RETURNING: a compare-and-set that also reads the clock.

    Each ``{now}`` in ``assignments`` or ``where`` stands where ``NOW`` stands in
    ``params``: the database's clock (``dbsql.clock``), read by this very statement.
    """
    now = clock()
    values = [value for param in params for value in (now.params if param is NOW else (param,))]
    sql = (
        f"UPDATE {table} SET {assignments.format(now=now.sql)} "
        f"WHERE {where.format(now=now.sql)} "
        f"RETURNING {', '.join(_quote(name) for name in returning)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row


# -- batches -----------------------------------------------------------------------------


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
    key = _quote(_column(model, meta.pk.name if match == "pk" else match))
    aliases = ", ".join(_quote(alias) for alias, _ in values)
    sets = ", ".join(f"{_quote(_column(model, name))} = {sql}" for name, sql in assign.items())
    where = [f"t.{key} = v.{_quote(values[0][0])}"]
    where += [
        f"t.{_quote(_column(model, name))} = v.{_quote(alias)}"
        for name, alias in (expect or {}).items()
    ]
    sql = (
        f"UPDATE {_quote(meta.db_table)} AS t SET {sets} "
        f"FROM (VALUES {', '.join([f'({casts})'] * len(rows))}) AS v({aliases}) "
        f"WHERE {' AND '.join(where)} RETURNING t.{key}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def bulk_save(objects: Sequence[Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of each of ``objects`` (one model) in one statement.

    ``Model.save(update_fields=…)`` for many rows: ``values_update`` on PostgreSQL,
    ``bulk_update`` elsewhere (SQLite, the embedded default, has one writer at a time).
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
        assign={name: f"v.{_quote(attname)}" for name, attname in zip(fields, names, strict=True)},
    )
