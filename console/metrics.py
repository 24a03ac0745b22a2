"""The host API's request counts and latencies, for /metrics (``recovery.metrics``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from recovery.metrics import HOST_API_REQUESTS, HOST_API_SECONDS


class HostApiMetricsMiddleware:
    """Count and time every request under /api/, labelled by its route, not its path.

    The route (``api/v1/operations/<str:key>/resume``) keeps the number of series bounded
    whatever keys hosts send; a path that matched no route is ``unmatched``.
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
        HOST_API_SECONDS.labels(endpoint=endpoint).observe(time.perf_counter() - started)
        HOST_API_REQUESTS.labels(
            endpoint=endpoint, method=request.method or "", status=str(response.status_code)
        ).inc()
        return response
