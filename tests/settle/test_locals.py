"""Django's per-thread state through settle.locals: the readers see what asgiref's own
``Local`` objects see, in every kind of thread and context, and store into them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.local import Local
from asgiref.sync import async_to_sync, sync_to_async
from django.core.cache import caches
from django.db import connections
from django.urls import base as urls_base
from django.urls import get_script_prefix, get_urlconf, set_script_prefix, set_urlconf

from settle.locals import Reader, install, reader_of

_MISSING = "(not set)"


def _seen(local: Any) -> Any:
    return getattr(local, "x", _MISSING)


def _in_thread(work: Callable[[], Any]) -> Any:
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(work()))
    thread.start()
    thread.join()
    return answer[0]


def _scenario(local: Any) -> list[Any]:
    """What ``local`` shows through sets, deletes, threads, an event loop, its tasks, and
    asgiref's bridges both ways."""
    seen = [_seen(local)]
    local.x = "main"
    seen.append(_seen(local))

    def other_thread() -> list[Any]:
        before = _seen(local)
        local.x = "other"
        return [before, _seen(local)]

    seen += _in_thread(other_thread)
    seen.append(_seen(local))

    async def in_loop() -> list[Any]:
        before = _seen(local)
        local.x = "loop"

        async def task() -> Any:
            return _seen(local)

        from_task = await asyncio.create_task(task())
        from_sync = await sync_to_async(lambda: _seen(local))()
        from_sync_thread = await sync_to_async(lambda: _seen(local), thread_sensitive=False)()
        # A copy of this context in another thread: asgiref does not show it there.
        from_copied = await asyncio.to_thread(lambda: _seen(local))
        return [before, _seen(local), from_task, from_sync, from_sync_thread, from_copied]

    seen += asyncio.run(in_loop())
    seen.append(_seen(local))

    async def bridged() -> Any:
        return _seen(local)

    seen.append(async_to_sync(bridged)())
    del local.x
    seen.append(_seen(local))
    with pytest.raises(AttributeError):
        del local.x
    return seen


@pytest.mark.parametrize("thread_critical", [True, False])
def test_a_reader_shows_what_asgirefs_local_shows_everywhere(thread_critical):
    plain = Local(thread_critical=thread_critical)
    behind = Local(thread_critical=thread_critical)
    reader = reader_of(behind)
    assert isinstance(reader, Reader)
    expected = _scenario(plain)
    assert _scenario(reader) == expected
    # Not every step shows the same: the scenario tells the two kinds apart.
    assert len(set(map(str, expected))) > 2


@pytest.mark.parametrize("thread_critical", [True, False])
def test_what_a_reader_stores_is_in_asgirefs_own_local(thread_critical):
    behind = Local(thread_critical=thread_critical)
    reader = reader_of(behind)
    reader.x = "stored"  # type: ignore[union-attr]
    assert behind.x == "stored"
    behind.y = "asgiref's"
    assert reader.y == "asgiref's"  # type: ignore[union-attr]


def test_django_reads_its_connections_caches_urlconf_and_prefix_through_readers():
    assert install() == []  # all four were built as settle.locals knows
    for local in (
        connections._connections,
        caches._connections,
        urls_base._urlconfs,
        urls_base._prefixes,
    ):
        assert isinstance(local, Reader)
    # The same connection in this thread each time; another thread has its own.
    assert connections["default"] is connections["default"]
    assert _in_thread(lambda: connections["default"]) is not connections["default"]
    set_urlconf("tests.urls_elsewhere")
    try:
        assert get_urlconf() == "tests.urls_elsewhere"
        assert _in_thread(get_urlconf) is None
    finally:
        set_urlconf(None)
    assert get_urlconf() is None
    prefix = get_script_prefix()
    set_script_prefix("/behind/")
    try:
        assert get_script_prefix() == "/behind/"
    finally:
        set_script_prefix(prefix)


def test_a_local_built_otherwise_is_left_as_it_is():
    assert reader_of(threading.local()) is None
    reader = reader_of(Local())
    assert reader is not None and reader_of(reader) is reader
