"""Writes written out instead of built by the ORM: inserts and updates (many rows each
with values of their own: ``dbsql.batches``).

The same discipline as ``dbsql.rows``: one text per model and shape, kept, and values
converted exactly as the ORM converts them (``get_db_prep_save``).

insert
    ``save(force_insert=True)`` / ``bulk_create`` for instances of one model: one INSERT,
    ``auto_now_add`` and ``auto_now`` applied, database-made primary keys read back;
    or, for one row, ``INSERT … ON CONFLICT DO NOTHING``.
upsert
    ``update_or_create`` in one statement: ``INSERT … ON CONFLICT (…) DO UPDATE …
    RETURNING``, the row's keys read back whether it was made or found;
    ``insert_upserting``: a row and the one it names by foreign key, upserted, together.
update
    ``filter(…).update(…)``: equality conditions, values or SQL expressions assigned;
    the number of rows changed.
update_returning
    A compare-and-set that also reads the database's clock (``NOW``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import Field, ForeignKey, Model

from dbsql import columns
from dbsql.clock import clock
from dbsql.cursor import kept_cursor, vendor
from dbsql.rows import model_from_row, select_first, selected_columns

NOW = object()  # a parameter of ``update_returning``: the database's clock goes here


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
    returning = ", ".join(columns.quote(str(field.column)) for field in returned)
    names = ", ".join(columns.quote(str(field.column)) for field in written)
    return written, names, returned, f" RETURNING {returning}" if returning else ""


@functools.cache
def _written_plan(model: type[Model], but: str | None = None) -> columns.Plan:
    """The ``columns.save_plan`` of the fields an INSERT of ``model`` writes (``but`` the
    field of that name, whose value the statement makes), kept."""
    written = _insert_shape(model)[0]
    left = columns.field(model, but) if but is not None else None
    return columns.save_plan([each for each in written if each is not left])


Rider = tuple[str, Sequence[Any]]  # a write and its parameters, run with another (insert)


def insert(
    objects: Sequence[Model],
    *,
    unless_conflict: bool = False,
    riders: Sequence[Rider] = (),
    rider_counts: list[int] | None = None,
) -> int:
    """Insert ``objects`` (all of one model, not saved yet) in one statement.

    What ``save(force_insert=True)`` and ``bulk_create`` do for them: each field's
    ``pre_save`` (``auto_now_add``), its conversion, and the keys the database makes
    read back into the objects, which are then saved instances. No signals are sent:
    none of Settle's models has a receiver.

    ``unless_conflict`` (one object): ``ON CONFLICT DO NOTHING`` — when a unique
    constraint, a partial one included, already holds a row like it, nothing is
    inserted and the object stays unsaved. Returns the number of rows inserted.

    ``riders``: other writes (``update_sql``'s) of other rows, run by the same statement
    on PostgreSQL (each in a ``WITH``: one round trip for all), each before it elsewhere
    (SQLite has no writing ``WITH``); ``rider_counts`` is given their row counts.
    """
    counts = rider_counts if rider_counts is not None else []
    if riders and (not objects or vendor() != "postgresql"):
        with kept_cursor() as cursor:
            for write, values in riders:
                cursor.execute(write, values)
                counts.append(int(cursor.rowcount))
        riders = ()
    if not objects:
        return 0
    assert not unless_conflict or len(objects) == 1, "which rows went in is read back for one"
    _, _, returned, returning = _insert_shape(type(objects[0]))
    assert not any(getattr(obj, f.attname) for obj in objects for f in returned), "made by it"
    text, params = insert_sql(objects)
    ridden = ""
    if riders:
        # Each rider's rows counted by the statement's RETURNING, after the keys it reads.
        assert returning and not unless_conflict, "the rows read back carry the counts"
        ridden = (
            "WITH "
            + ", ".join(f"r{n} AS ({write} RETURNING 1)" for n, (write, _) in enumerate(riders))
            + " "
        )
        returning += "".join(f", (SELECT count(*) FROM r{n})" for n in range(len(riders)))
        params = [value for _, values in riders for value in values] + list(params)
    sql = f"{ridden}{text}{' ON CONFLICT DO NOTHING' if unless_conflict else ''}{returning}"
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall() if returning else []
        inserted = len(rows) if returning else cursor.rowcount
    if riders:
        counts += [int(count) for count in rows[0][len(returned) :]]
    if unless_conflict and not inserted:
        return 0
    for index, obj in enumerate(objects):
        if rows:
            for field, value in zip(returned, rows[index][: len(returned)], strict=True):
                setattr(obj, field.attname, value)
        obj._state.adding = False
        obj._state.db = DEFAULT_DB_ALIAS  # what `connection.alias` reads, without the lookup
    return inserted


def insert_sql(objects: Sequence[Model]) -> Rider:
    """``insert``'s statement for ``objects`` (one model), not run, reading nothing back:
    to ride with another (``audit_transaction_rider``); the keys the database makes stay
    unknown to the objects, which stay unsaved."""
    model = type(objects[0])
    assert all(type(obj) is model for obj in objects), "one model per statement"
    written, names, _, _ = _insert_shape(model)
    plan = _written_plan(model)
    params: list[Any] = []
    for obj in objects:
        params += columns.plan_values(plan, obj)
    row_marks = "(" + ", ".join(["%s"] * len(written)) + ")"
    table = columns.quote(model._meta.db_table)
    return f"INSERT INTO {table} ({names}) VALUES {', '.join([row_marks] * len(objects))}", params


def _upsert_sql(
    obj: Model, conflict: Sequence[str], update: Sequence[str]
) -> tuple[str, list[Any], tuple[Field[Any, Any], ...]]:
    model = type(obj)
    written, names, returned, returning = _insert_shape(model)
    assert returning, "the row's key is read back"
    values = columns.plan_values(_written_plan(model), obj)
    target = ", ".join(columns.quote(columns.column(model, name)) for name in conflict)
    sets = ", ".join(
        f"{columns.quote(columns.column(model, name))} = EXCLUDED."
        f"{columns.quote(columns.column(model, name))}"
        for name in update
    )
    sql = (
        f"INSERT INTO {columns.quote(model._meta.db_table)} ({names}) "
        f"VALUES ({', '.join(['%s'] * len(written))}) "
        f"ON CONFLICT ({target}) DO UPDATE SET {sets}{returning}"
    )
    return sql, values, returned


def _saved(obj: Model, returned: Sequence[Field[Any, Any]], row: Sequence[Any]) -> None:
    for field, value in zip(returned, row, strict=True):
        setattr(obj, field.attname, value)
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS


def upsert(obj: Model, *, conflict: Sequence[str], update: Sequence[str]) -> None:
    """Insert ``obj`` (not saved yet), or update the row whose ``conflict`` fields (a
    unique constraint) it shares with its ``update`` fields; either way ``obj`` is then
    that saved row, its database-made keys read back. One statement."""
    sql, values, returned = _upsert_sql(obj, conflict, update)
    with kept_cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    _saved(obj, returned, row)


def insert_upserting(
    obj: Model, *, field: str, conflict: Sequence[str], update: Sequence[str]
) -> None:
    """Insert ``obj`` (not saved yet) naming, by its foreign key ``field``, the row its
    unsaved ``field`` object is upserted as (``upsert``); both are then saved.

    One statement on PostgreSQL (the upsert in a ``WITH`` the insert reads its key from);
    two elsewhere (SQLite has no writing ``WITH``).
    """
    named = getattr(obj, field)
    assert named is not None and named.pk is None, "the named row is upserted here"
    if vendor() != "postgresql":
        upsert(named, conflict=conflict, update=update)
        setattr(obj, field, named)
        insert([obj])
        return
    upserted, upsert_values, named_returned = _upsert_sql(named, conflict, update)
    model = type(obj)
    written, names, returned, _ = _insert_shape(model)
    assert not returned, "only the named row's key is read back"
    key = columns.field(model, field)
    marks = ["(SELECT u.id FROM u)" if each is key else "%s" for each in written]
    values = columns.plan_values(_written_plan(model, field), obj)
    sql = (
        f"WITH u AS ({upserted}) INSERT INTO {columns.quote(model._meta.db_table)} ({names}) "
        f"VALUES ({', '.join(marks)}) RETURNING {columns.quote(str(key.column))}"
    )
    assert [f.attname for f in named_returned] == ["id"], "the named row's key is its id"
    with kept_cursor() as cursor:
        cursor.execute(sql, [*upsert_values, *values])
        row = cursor.fetchone()
    _saved(named, named_returned, row)
    setattr(obj, field, named)
    _saved(obj, (), ())


def insert_naming(obj: Model, field: str, **where: Any) -> Model | None:
    """Insert ``obj`` (not saved yet) with its foreign key ``field`` pointing at the row
    that ``where`` finds (``select_first``'s equality on the model ``field`` names), and
    return that row, set on ``obj``; None, and nothing inserted, where there is none.

    ``select_first`` then ``insert``, in one statement on PostgreSQL: ``WITH f AS (SELECT
    … LIMIT 1), i AS (INSERT … SELECT …, f.id FROM f RETURNING …) SELECT f.*, i.* FROM f
    LEFT JOIN i``. What the INSERT raises (a unique key taken) it raises.
    """
    model = type(obj)
    relation = columns.field(model, field)
    named: type[Model] = relation.related_model  # type: ignore[assignment]
    if vendor() != "postgresql":
        found = select_first(named, **where)
        if found is not None:
            setattr(obj, field, found)
            insert([obj])
        return found
    _, _, returned, _ = _insert_shape(model)
    shape, conditions = columns.where_shape(named, where)
    sql = _insert_naming_sql(model, field, shape)
    values = columns.plan_values(_written_plan(model, field), obj)
    with kept_cursor() as cursor:
        cursor.execute(sql, [*conditions, *values])
        row = cursor.fetchone()
    if row is None:
        return None
    fields = named._meta.concrete_fields
    found = model_from_row(named, fields, row[: len(fields)])
    setattr(obj, field, found)
    for each, value in zip(returned, row[len(fields) :], strict=True):
        setattr(obj, each.attname, value)
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS
    return found


@functools.cache
def _insert_naming_sql(model: type[Model], field: str, shape: columns.Shape) -> str:
    """``insert_naming``'s statement for one model, foreign key and shape, kept."""
    relation = columns.field(model, field)
    named: type[Model] = relation.related_model  # type: ignore[assignment]
    written, names, _, returning = _insert_shape(model)
    assert returning, "the row's keys are read back with the row it names"
    target = columns.quote(str(cast(ForeignKey[Any, Any], relation).target_field.column))
    selected = [
        f"f.{target}" if each is relation else f"CAST(%s AS {each.cast_db_type(connection)})"
        for each in written
    ]
    table = columns.quote(named._meta.db_table)
    return (
        f"WITH f AS (SELECT {selected_columns(named)} FROM {table} "
        f"WHERE {columns.conditions(named, shape)} LIMIT 1), "
        f"i AS (INSERT INTO {columns.quote(model._meta.db_table)} ({names}) "
        f"SELECT {', '.join(selected)} FROM f{returning}) "
        "SELECT f.*, i.* FROM f LEFT JOIN i ON TRUE"
    )


@functools.cache
def _insert_select_sql(model: type[Model], vendor: str) -> str:
    """``insert_where``'s statement up to its condition, for one model, kept."""
    written, names, _, _ = _insert_shape(model)
    # PostgreSQL types a SELECT list's parameters on its own: say each column's type.
    casts = [
        f"CAST(%s AS {field.cast_db_type(connection)})" if vendor == "postgresql" else "%s"
        for field in written
    ]
    return f"INSERT INTO {columns.quote(model._meta.db_table)} ({names}) SELECT {', '.join(casts)}"


def insert_where(obj: Model, condition: str, params: Sequence[Any]) -> bool:
    """Insert ``obj`` (not saved yet) only if ``condition`` holds, in one statement.

    ``INSERT … SELECT <values> WHERE <condition> RETURNING``: the check and the write are
    one statement, so a caller that holds the lock the condition depends on pays no
    separate read. Returns whether the row went in (then ``obj`` is saved).
    """
    model = type(obj)
    _, _, returned, returning = _insert_shape(model)
    values = columns.plan_values(_written_plan(model), obj)
    sql = f"{_insert_select_sql(model, vendor())} WHERE {condition}{returning}"
    with kept_cursor() as cursor:
        cursor.execute(sql, [*values, *params])
        rows = cursor.fetchall() if returning else []
        inserted = len(rows) if returning else cursor.rowcount
    if not inserted:
        return False
    for field, value in zip(returned, rows[0] if rows else (), strict=False):
        setattr(obj, field.attname, value)
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS
    return True


@functools.cache
def _update_sql(
    model: type[Model],
    assigned: tuple[str, ...],
    expressions: tuple[tuple[str, str], ...],
    where: columns.Shape,
) -> str:
    sets = [f"{columns.quote(columns.column(model, name))} = %s" for name in assigned]
    sets += [f"{columns.quote(columns.column(model, name))} = {sql}" for name, sql in expressions]
    return (
        f"UPDATE {columns.quote(model._meta.db_table)} SET {', '.join(sets)} "
        f"WHERE {columns.conditions(model, where)}"
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
    sql, params = update_sql(model, where=where, values=values, expressions=expressions)
    with kept_cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def update_sql(
    model: type[Model],
    *,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    expressions: Mapping[str, str] | None = None,
) -> Rider:
    """``update``'s statement and parameters, not run (to ride with another)."""
    shape, conditions = columns.where_shape(model, where)
    sql = _update_sql(model, tuple(values), tuple((expressions or {}).items()), shape)
    return sql, [columns.prep(model, name, value) for name, value in values.items()] + conditions


def save_fields(obj: Model, fields: Sequence[str]) -> None:
    """``obj.save(update_fields=fields)`` for a saved row, written out (``auto_now`` too)."""
    with kept_cursor() as cursor:
        cursor.execute(*save_fields_sql(obj, fields))


def save_fields_sql(obj: Model, fields: Sequence[str]) -> Rider:
    """``save_fields``' statement and parameters, not run (to ride with another)."""
    model = type(obj)
    return update_sql(
        model,
        where={"pk": obj.pk},
        values={name: columns.field(model, name).pre_save(obj, False) for name in fields},
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
        f"RETURNING {', '.join(columns.quote(name) for name in returning)}"
    )
    with kept_cursor() as cursor:
        cursor.execute(sql, values)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row
