"""Fixed windows of time, and one counter per window in the shared cache.

The one rule for "at most N a minute" wherever Settle caps something: the host API's
rate per credential (``recovery.ratelimit``), the sign-in failures each address may put
on the audit log (``identity.events``), and the refusals a permit's history records one
line each (``approvals.services.permits``, which counts its window in the database, under
the permit's lock, so that the count commits with the lines it decides).

The cache counter is one key per name and window, counted atomically in the shared
cache, so every worker on every machine counts against the same limit. On Redis, one
script counts and sets the key's expiry: one round trip a count, the host API's rate
limit being on every request. Other caches (a file cache, locmem) take the scheme
django-ratelimit uses: ``add``, then ``incr``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache

# INCR, and the expiry on the window's first count: a key never outlives its window by
# more than the timeout, and a count never needs a second round trip.
_REDIS_COUNT = """
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return count
"""


@dataclass(frozen=True)
class Window:
    """``[start, end)``: the window of ``seconds`` a moment falls in."""

    start: datetime
    end: datetime

    @classmethod
    def at(cls, moment: datetime, seconds: int) -> Window:
        start = datetime.fromtimestamp(moment.timestamp() // seconds * seconds, tz=UTC)
        return cls(start, start + timedelta(seconds=seconds))

    def seconds_left(self, moment: datetime) -> int:
        """Whole seconds from ``moment`` to the window's end, at least one."""
        return max(1, math.ceil((self.end - moment).total_seconds()))


class CounterUnavailable(Exception):
    """The cache did not answer: the caller decides whether that lets things through."""


def window_count(*, name: str, window: Window) -> int:
    """Count one more under ``name`` in ``window``; how many so far, this one included.

    ``CounterUnavailable`` when the cache errs. Outside Redis, a window's key that
    expired between ``add`` and ``incr`` belongs to a window already over: counted as
    the first.
    """
    key = f"{name}:{int(window.start.timestamp())}"
    # Kept a second past the window: a slow ``incr`` still finds it.
    timeout = math.ceil((window.end - window.start).total_seconds()) + 1
    try:
        cache = caches["default"]
        if isinstance(cache, RedisCache):
            stored = cache.make_and_validate_key(key)
            client = cache._cache.get_client(stored, write=True)
            return int(cast(int, client.eval(_REDIS_COUNT, 1, stored, str(timeout))))
        cache.add(key, 0, timeout=timeout)
        return int(cache.incr(key))
    except ValueError:
        return 1
    except Exception as exc:
        raise CounterUnavailable(str(exc)) from exc
