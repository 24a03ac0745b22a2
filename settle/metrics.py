"""The host API's request counts and latencies, for /metrics (``recovery.metrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from recovery.metrics import HOST_API_REQUESTS, HOST_API_SECONDS

# Any other method a client writes is counted as ``other``: a label per made-up method
# would let anyone add series to /metrics without bound.
KNOWN_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


class HostApiMetricsMiddleware:
    """Count and time every request under /api/, labelled by its route, not its path.

    Every label comes from a fixed set, whatever a client sends: the route
    (``api/v1/operations/<str:key>/resume``), not the path, and ``unmatched`` for a path
    that matched none; the method among ``KNOWN_METHODS``, else ``other``; the status
    code Settle itself answered.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        started = time.perf_counter()
        response = self.get_response(request)
        match = request.resolver_match
        endpoint = "/" + match.route if match is not None else "unmatched"
        timed = _timed.get(endpoint)
        if timed is None:
            timed = _timed[endpoint] = HOST_API_SECONDS.labels(endpoint=endpoint)
        timed.observe(time.perf_counter() - started)
        method = request.method if request.method in KNOWN_METHODS else "other"
        labels = (endpoint, method, response.status_code)
        counted = _counted.get(labels)
        if counted is None:
            counted = _counted[labels] = HOST_API_REQUESTS.labels(
                endpoint=endpoint, method=method, status=str(response.status_code)
            )
        counted.inc()
        return response


# Each label set's series, looked up once a process: the labels come from fixed sets
# (the class's docstring), so these stay as small as /metrics.
_timed: dict[str, Any] = {}
_counted: dict[tuple[str, str, int], Any] = {}
