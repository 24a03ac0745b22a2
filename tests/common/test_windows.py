"""One windowed counter (``common.windows``): the host rate, the sign-in failures each
address may record, and the permit's refusal lines all count in the same windows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis
import time_machine
from django.core.cache import caches
from django.test import Client

from approvals.services.permits import refusal_window
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.windows import CounterUnavailable, Window, window_count
from tests.support.private_services import PrivateRedis, private_redis  # noqa: F401

AT = datetime(2026, 12, 3, 12, 0, 59, 500000, tzinfo=UTC)


def test_a_moment_falls_in_one_window_of_its_length() -> None:
    window = Window.at(AT, 60)
    assert (window.start, window.end) == (
        AT.replace(second=0, microsecond=0),
        AT.replace(minute=1, second=0, microsecond=0),
    )
    assert window.seconds_left(AT) == 1
    assert Window.at(AT, 120).start == AT.replace(second=0, microsecond=0)


def test_the_permits_refusal_lines_count_in_the_same_windows(settings: Any) -> None:
    settings.SETTLE_REFUSAL_WINDOW_SECONDS = 120
    window = Window.at(AT, 120)
    assert refusal_window(AT) == (window.start, window.end)


def test_a_count_is_per_name_and_per_window() -> None:
    window = Window.at(AT, 60)
    assert [window_count(name="a", window=window) for _ in range(3)] == [1, 2, 3]
    assert window_count(name="b", window=window) == 1
    assert window_count(name="a", window=Window.at(window.end, 60)) == 1


def test_on_redis_each_count_is_one_round_trip_and_the_key_expires_with_its_window(
    settings: Any,
    private_redis: PrivateRedis,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": private_redis.url(),
            "KEY_PREFIX": "settle",
        }
    }
    sent: list[object] = []
    original = redis.connection.Connection.send_packed_command

    def counted(self: redis.connection.Connection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        original(self, command, check_health)

    window = Window.at(AT, 60)
    window_count(name="warm", window=window)  # the connection's own handshake, once
    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    assert [window_count(name="a", window=window) for _ in range(3)] == [1, 2, 3]
    assert len(sent) == 3
    assert window_count(name="b", window=window) == 1
    monkeypatch.undo()
    # The key is the cache's own (read back through it), and lives a second past the window.
    key = f"a:{int(window.start.timestamp())}"
    assert caches["default"].get(key) == 3
    stored = caches["default"].make_and_validate_key(key)
    ttl = redis.Redis.from_url(private_redis.url()).ttl(stored)
    assert 0 < ttl <= 61


def test_a_cache_that_does_not_answer_is_said_so(settings: Any) -> None:
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:9/0",
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    with pytest.raises(CounterUnavailable):
        window_count(name="a", window=Window.at(AT, 60))


@pytest.mark.django_db
def test_sign_in_failures_are_capped_in_the_refusal_window_not_a_fixed_minute(
    settings: Any,
) -> None:
    settings.SETTLE_REFUSALS_RECORDED_PER_MINUTE = 2
    settings.SETTLE_REFUSAL_WINDOW_SECONDS = 120
    client = Client(REMOTE_ADDR="203.0.113.9")
    # Two minutes of one window: the cap holds across both.
    for n, second in enumerate((5, 65, 70)):
        at = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC).timestamp() + second
        with time_machine.travel(at, tick=False):
            client.post("/login/", {"login": f"guess-{n}", "password": "nope"})
    failed = AuditEvent.objects.filter(kind=AuditKind.SIGN_IN_FAILED)
    assert [event.data["username"] for event in failed.order_by("id")] == ["guess-0", "guess-1"]
