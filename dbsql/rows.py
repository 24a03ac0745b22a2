"""Statements written out instead of built by the ORM: the host API's path, and batches.

Reads are here; writes in ``dbsql.writes``; what both build from in ``dbsql.columns``.

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
model_from_row
    A model instance from a raw row, converted as the ORM converts.
values_from_rows
    Raw rows' values, each converted as the ORM converts its field (of any model).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models import DEFERRED, Field, Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from dbsql import columns
from dbsql.clock import clock
from dbsql.cursor import default_connection, kept_cursor, vendor

M = TypeVar("M", bound=Model)

# -- reading -----------------------------------------------------------------------------


Conversions = tuple[tuple[int, Any, tuple[Callable[..., Any], ...]], ...]


@functools.cache
def _conversions(
    vendor: str, fields: tuple[Field[Any, Any], ...], model: type[Model] | None
) -> tuple[list[str], Conversions]:
    """The attributes a row of ``fields`` fills, and its columns that have converters:
    their index, the column (of ``model``'s table, else each field's model's), and the
    backend's and the field's converters (on PostgreSQL, few columns have any)."""
    del vendor  # part of the key only: the backend decides the converters
    converted = []
    for index, field in enumerate(fields):
        column = field.get_col((model or field.model)._meta.db_table)
        converters = (
            *connection.ops.get_db_converters(column),
            *column.get_db_converters(connection),
        )
        if converters:
            converted.append((index, column, converters))
    return [field.attname for field in fields], tuple(converted)


@functools.cache
def _model_conversions(model: type[Model]) -> tuple[list[str], Conversions]:
    """``_conversions`` of a row of the model's own concrete fields, kept by model: a key
    that hashes no field (``Field.__hash__`` is a method of Python's, once a field)."""
    return _conversions(vendor(), tuple(model._meta.concrete_fields), model)


def _convert(converted: Conversions, values: list[Any]) -> None:
    db = default_connection()
    for index, column, converters in converted:
        value = values[index]
        for converter in converters:
            value = converter(value, column, db)
        values[index] = value


def model_from_row(model: type[M], fields: Sequence[Any], row: Sequence[Any]) -> M:
    """A model instance from a raw row, converted the way Django's own queries convert."""
    if fields is model._meta.concrete_fields:  # as nearly every caller reads a row
        attnames, converted = _model_conversions(model)
    else:
        attnames, converted = _conversions(vendor(), tuple(fields), model)
    if len(row) != len(attnames):
        raise ValueError(f"a row of {len(row)} values for {len(attnames)} fields")
    values = list(row)
    if converted:
        _convert(converted, values)
    if not _plain(model):
        return model.from_db(DEFAULT_DB_ALIAS, attnames, values)
    found = _instance(model, zip(attnames, values, strict=True))
    found._state.adding, found._state.db = False, DEFAULT_DB_ALIAS
    return found


def model_unsaved(model: type[M], **values: Any) -> M:
    """``model(**values)``: an instance to insert, made as ``Model.__init__`` makes it.

    Where nothing hooks the constructor (``_plain``) and every value names a concrete
    field, by its attribute (``host_id``) or, for a relation, by its name (``host``):
    each given value as it is, a relation's set through its descriptor (which keeps the
    object, as the constructor's setting it does), every other field its default, without
    the constructor's work on each field. Anything else: the constructor itself."""
    if not _plain(model):
        return model(**values)
    defaults, relations = _unsaved_plan(model)
    related = []
    for name, value in values.items():
        if value is DEFERRED:
            return model(**values)
        if name not in defaults:
            if name not in relations:
                return model(**values)  # a property, a field not concrete: the constructor's
            related.append(name)
    # What ``_instance`` makes, its ``__dict__`` filled in place: no list of pairs built
    # (0.08 M instructions a lifecycle, four instances).
    found = model.__new__(model)
    found._state = ModelState()
    fields = found.__dict__
    for attname, field in defaults.items():
        fields[attname] = values[attname] if attname in values else field.get_default()
    for name in related:
        setattr(found, name, values[name])
    return found


@functools.cache
def _unsaved_plan(model: type[Model]) -> tuple[dict[str, Field[Any, Any]], frozenset[str]]:
    """``model``'s concrete fields by attribute, in the constructor's order, and the names
    of those that are relations (set by name through their descriptors)."""
    concrete = [field for field in model._meta.concrete_fields if not field.generated]
    relations = frozenset(field.name for field in concrete if field.is_relation)
    return {field.attname: field for field in concrete}, relations


def _instance(model: type[M], values: Iterable[tuple[str, Any]]) -> M:
    """What ``Model.__init__`` makes of every field's value, without its work a field:
    each value in the instance's ``__dict__`` (where its descriptor reads it), and a
    new ``_state``; only for a model nothing hooks (``_plain``)."""
    found = model.__new__(model)
    found.__dict__.update(values)
    found._state = ModelState()
    return found


@functools.cache
def _plain(model: type[Model]) -> bool:
    """Whether ``model``'s instances are made by Django's own ``__init__`` and
    ``from_db``, with no receiver of ``pre_init`` or ``post_init``: then ``_instance``
    makes the same instance. Decided once a model, its receivers connected at start."""
    return (
        model.from_db.__func__ is Model.from_db.__func__  # type: ignore[attr-defined]
        and model.__init__ is Model.__init__
        and not pre_init.has_listeners(model)
        and not post_init.has_listeners(model)
    )


def values_from_rows(
    fields: tuple[Field[Any, Any], ...], rows: Sequence[Sequence[Any]]
) -> list[list[Any]]:
    """``rows``' values, each converted as the ORM converts a column of ``fields``' one.

    For a statement whose columns come from several tables (or from subqueries that
    read one column each): what ``model_from_row`` does for one model's row, the
    converters looked up once for all the rows.
    """
    _, converted = _conversions(vendor(), fields, None)
    values = [list(row) for row in rows]
    if converted:
        for row in values:
            _convert(converted, row)
    return values


@functools.cache
def selected_columns(model: type[Model]) -> str:
    """The model's columns, as ``model_from_row`` reads them back."""
    return ", ".join(columns.quote(str(field.column)) for field in model._meta.concrete_fields)


@functools.cache
def _select_sql(model: type[Model], shape: columns.Shape) -> str:
    return (
        f"SELECT {selected_columns(model)} FROM {columns.quote(model._meta.db_table)} "
        f"WHERE {columns.conditions(model, shape)} "
        f"ORDER BY {columns.quote(str(model._meta.pk.column))} LIMIT 1"
    )


def select_first(model: type[M], **where: Any) -> M | None:
    """``model.objects.filter(**where).first()``, equality on columns only."""
    shape, params = columns.where_shape(model, where)
    with kept_cursor() as cursor:
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
    shape, params = columns.where_shape(model, where)
    with kept_cursor() as cursor:
        cursor.execute(_select_at_sql(model, shape, now.sql), [*now.params, *params])
        at, *row = cursor.fetchone()
    fields = model._meta.concrete_fields
    missing = row[fields.index(model._meta.pk)] is None
    return (None if missing else model_from_row(model, fields, row)), at


@functools.cache
def _select_at_sql(model: type[Model], shape: columns.Shape, clock_sql: str) -> str:
    # One row always: the clock, and the row's columns (NULL when there is none).
    return (
        f"SELECT {clock_sql}, t.* FROM (SELECT 1) clock "
        f"LEFT JOIN ({_select_sql(model, shape)}) t ON TRUE"
    )


@functools.cache
def select_locked_with_sql(model: type[Model], related: str) -> str:
    """``select_locked_with``'s text, ``{where}`` left to fill in (``t``: the row, ``r``:
    the related row); ``FOR NO KEY UPDATE OF t`` where the database has it."""
    target = columns.field(model, related).related_model
    assert isinstance(target, type) and issubclass(target, Model), f"{related} is a foreign key"
    selected = [f"t.{columns.quote(str(f.column))}" for f in model._meta.concrete_fields]
    selected += [f"r.{columns.quote(str(f.column))}" for f in target._meta.concrete_fields]
    lock = " FOR NO KEY UPDATE OF t" if connection.features.has_select_for_update_of else ""
    joined = columns.quote(columns.column(model, related))
    return (
        f"SELECT {', '.join(selected)} FROM {columns.quote(model._meta.db_table)} t "
        f"JOIN {columns.quote(target._meta.db_table)} r "
        f"ON r.{columns.quote(str(target._meta.pk.column))} = t.{joined} "
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
    with kept_cursor() as cursor:
        cursor.execute(select_locked_with_sql(model, related).format(where=where), params)
        row = cursor.fetchone()
    if row is None:
        return None
    fields = model._meta.concrete_fields
    found = model_from_row(model, fields, row[: len(fields)])
    field = columns.field(model, related)
    target = field.related_model
    assert isinstance(target, type) and issubclass(target, Model)
    found._state.fields_cache[field.name] = model_from_row(
        target, target._meta.concrete_fields, row[len(fields) :]
    )
    return found
