"""The per-credential rate limit's own cost on Redis: CPU, wall time and round trips a call.

    python bench/ratelimit.py [--calls 20000] [--rounds 3]

``CELERY_BROKER_URL`` (or ``SETTLE_CACHE_URL``) names the Redis, as for the server; the
keys are the cache's own and expire with their windows. Alternates, round by round, the
counter the host API runs (``recovery.ratelimit.rate_limit_wait``: one script a call)
and the scheme it replaced (the cache's ``add`` then ``incr``: two commands, two round
trips), each ``--calls`` times from this process; prints the medians of the process's
CPU (``time.process_time``) and wall time per call, and the round trips per call
(the commands redis-py sent, counted in a separate pass so as not to weigh on the time).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.core.cache.backends.redis import RedisCache  # noqa: E402
from django.utils import timezone  # noqa: E402
from redis.connection import Connection  # noqa: E402

from common.windows import Window  # noqa: E402
from recovery.ratelimit import rate_limit_wait  # noqa: E402


def add_then_incr() -> None:
    """The scheme before this one, as ``common.windows`` ran it: two round trips."""
    window = Window.at(timezone.now(), 2)
    key = f"host-rate:bench-old:{int(window.start.timestamp())}"
    cache = caches["default"]
    cache.add(key, 0, timeout=math.ceil((window.end - window.start).total_seconds()) + 1)
    cache.incr(key)


def script() -> None:
    rate_limit_wait(credential="bench-new")


def measure(call: Callable[[], None], calls: int) -> tuple[float, float]:
    """CPU ms and wall ms per call."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu * 1000 / calls, wall * 1000 / calls


def round_trips(call: Callable[[], None], calls: int = 100) -> float:
    """What redis-py sent per call: each ``send_packed_command`` is one round trip."""
    sent = 0
    original = Connection.send_packed_command

    def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        nonlocal sent
        sent += 1
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    Connection.send_packed_command = counted  # type: ignore[method-assign,assignment]
    try:
        for _ in range(calls):
            call()
    finally:
        Connection.send_packed_command = original  # type: ignore[method-assign]
    return sent / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not isinstance(caches["default"], RedisCache):
        sys.exit("bench/ratelimit.py measures Redis: set CELERY_BROKER_URL=redis://…")
    # On, and never reached by this bench's calls.
    settings.SETTLE_HOST_RATE_PER_SECOND = 1_000_000
    settings.SETTLE_HOST_RATE_BURST = 2_000_000
    schemes = {"one script (now)": script, "add then incr (before)": add_then_incr}
    for call in schemes.values():
        measure(call, 200)  # warm: the connection, the script's first load
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in schemes}
    for _ in range(args.rounds):
        for name, call in schemes.items():
            found[name].append(measure(call, args.calls))
    print(f"load {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.calls} calls each")
    print("| counter | CPU ms per call | wall ms per call | round trips per call |")
    print("| --- | --- | --- | --- |")
    for name, runs in found.items():
        cpu, wall = (statistics.median(r[i] for r in runs) for i in range(2))
        print(f"| {name} | {cpu:.4f} | {wall:.4f} | {round_trips(schemes[name]):.2f} |")


if __name__ == "__main__":
    main()
