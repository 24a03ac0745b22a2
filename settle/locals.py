"""Django's per-thread state read the way asgiref stores it, without asgiref's detours.

Django keeps each thread's database connections, caches, URLconf and script prefix in
asgiref's ``Local`` objects, which every request reads many times (its signals close old
connections and caches, reset the URLconf; ``atomic`` and the resolver look them up).
A ``Local`` made ``thread_critical`` (the connections) asks asyncio for the running loop
at every read, and in a thread without one that question is answered by an exception;
the others look in a context variable under a lock, and a name not set there costs two
exceptions and a ``repr``. ``install`` puts in front of each a reader of the same storage:
a thread-critical one reads its thread's ``threading.local`` where no loop runs
(``asyncio._get_running_loop``, the question without the exception) and leaves the event
loop's threads to asgiref; the others read the context variable's value as asgiref does,
thread tag and all, and raise one ``AttributeError`` for a name not set. Every write goes
to asgiref's own object, so nothing is stored twice and nothing changes meaning.

``install`` checks first that each ``Local`` is built as the asgiref release this was
written for builds them (``asgiref.local``'s ``_ThreadCriticalLocal`` over a
``threading.local``; ``_DefaultLocal`` over a ``_CVar`` of ``_Storage``); where one is
not, it leaves that one as it is and says so in its answer, and
``tests/settle/test_locals.py`` fails on it.
"""

from __future__ import annotations

import threading
from asyncio import _get_running_loop
from contextvars import ContextVar
from threading import get_ident
from typing import Any

from asgiref import local as asgiref_local
from django.core.cache import caches
from django.db import connections
from django.urls import base as urls_base


class Reader:
    """What ``install`` puts in front of a ``Local``: ``reader_of`` makes one class for
    each, over that ``Local``'s own storage (each attribute read is then one call)."""

    __slots__ = ()


def thread_critical_reader(local: Any) -> Reader:
    """A ``Local(thread_critical=True)``: its thread's own storage where no loop runs."""
    thread = vars(local)["_storage"]  # the threading.local asgiref reads there

    class ThreadCriticalReader(Reader):
        __slots__ = ()

        def __getattribute__(self, key: str) -> Any:
            if _get_running_loop() is None:
                return getattr(thread, key)
            return getattr(local, key)

        def __setattr__(self, key: str, value: Any) -> None:
            setattr(thread if _get_running_loop() is None else local, key, value)

        def __delattr__(self, key: str) -> None:
            delattr(thread if _get_running_loop() is None else local, key)

    return ThreadCriticalReader()


def context_reader(local: Any) -> Reader:
    """A ``Local()``: its context variable's value read as asgiref reads it (storage tagged
    with another thread's id is not this thread's); every write is asgiref's."""
    var = vars(vars(local)["_storage"])["_data"]

    class ContextReader(Reader):
        __slots__ = ()

        def __getattribute__(self, key: str) -> Any:
            storage = var.get(None)
            if storage is not None and storage.thread_id == get_ident():
                data = storage.data
                if key in data:
                    return data[key]
            raise AttributeError(key)

        def __setattr__(self, key: str, value: Any) -> None:
            setattr(local, key, value)

        def __delattr__(self, key: str) -> None:
            delattr(local, key)

    return ContextReader()


def _thread_critical(local: Any) -> bool:
    return type(local).__name__ == "_ThreadCriticalLocal" and isinstance(
        vars(local).get("_storage"), threading.local
    )


def _contextual(local: Any) -> bool:
    storage = vars(local).get("_storage")
    return (
        type(local).__name__ == "_DefaultLocal"
        and type(storage).__name__ == "_CVar"
        and isinstance(vars(storage).get("_data"), ContextVar)
        and getattr(asgiref_local, "_Storage", None) is not None
        and set(asgiref_local._Storage.__slots__) == {"thread_id", "data"}
    )


def reader_of(local: Any) -> Reader | None:
    """The reader for ``local``: itself if it is one; none if it is built otherwise."""
    if issubclass(type(local), Reader):
        return local  # type: ignore[no-any-return]
    if _thread_critical(local):
        return thread_critical_reader(local)
    if _contextual(local):
        return context_reader(local)
    return None


def install() -> list[str]:
    """Put the readers in front of Django's ``Local`` objects; the names of those left as
    they were (built otherwise than this module knows), none where all are read."""
    left = []
    for owner, name, label in (
        (connections, "_connections", "django.db.connections"),
        (caches, "_connections", "django.core.cache.caches"),
        (urls_base, "_urlconfs", "django.urls.base._urlconfs"),
        (urls_base, "_prefixes", "django.urls.base._prefixes"),
    ):
        reader = reader_of(getattr(owner, name))
        if reader is None:
            left.append(label)
        else:
            setattr(owner, name, reader)
    return left
