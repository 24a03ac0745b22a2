"""What ``dbsql.rows`` and ``dbsql.writes`` both build their statements from: a model's
columns by field name, quoted, and the shape of equality conditions."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.db import connection
from django.db.models import Field, Model

PLAIN = (int, str, bool)


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
    return field(model, name).get_db_prep_save(value, connection)


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
