"""The events the core counts for /metrics: lookups, host-API requests, sweeps.

Bumped by the process where the thing happened (a web process for a host-API request, a
worker for a lookup or a sweep), in prometheus-client's multiprocess mode: each process
writes its own file under ``PROMETHEUS_MULTIPROC_DIR`` and a scrape sums the files of
that machine. The exposition, the gauges read at scrape time and the directory's
bookkeeping are ``monitoring.metrics``'.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram

LOOKUPS = Counter(
    "settle_lookups", "Provider lookups answered, by verdict.", ["provider", "verdict"]
)
LOOKUP_SECONDS = Histogram(
    "settle_lookup_duration_seconds",
    "Time one read of a provider took (one lookup, or one batch of one provider's).",
    ["provider"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
HOST_API_REQUESTS = Counter(
    "settle_host_api_requests",
    "Host-API requests answered, by endpoint (route name), method and status.",
    ["endpoint", "method", "status"],
)
HOST_API_SECONDS = Histogram(
    "settle_host_api_request_duration_seconds",
    "Time the host API took to answer, by endpoint.",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
SWEEP_SECONDS = Histogram(
    "settle_sweep_duration_seconds",
    "Time one sweep took (lapsed leases, due lookups queued and published).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@contextmanager
def lookup_timed(provider: str) -> Iterator[None]:
    """Observe one read of ``provider`` into ``LOOKUP_SECONDS``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        LOOKUP_SECONDS.labels(provider=provider).observe(time.perf_counter() - started)
