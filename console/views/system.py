"""Health check, the status page, /metrics and the error pages (JSON under /api/, HTML
elsewhere)."""

from __future__ import annotations

import hmac
import logging
import sys
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import DatabaseError, connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import loader
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from common.errors import ErrorCode
from dbsql.errors import database_unavailable
from monitoring.metrics import metrics_text
from monitoring.selectors.health import liveness
from monitoring.status import status_checks
from recovery.api import error_response

logger = logging.getLogger(__name__)


def _metrics_bearer(request: HttpRequest) -> bool:
    """Whether the request carries ``SETTLE_METRICS_TOKEN`` (compared in constant time)."""
    token = settings.SETTLE_METRICS_TOKEN
    if not token:
        return False
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _unauthorized() -> HttpResponse:
    response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="settle-metrics"'
    return response


@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    """``{"ok": true, "database": …}`` for the proxy; with ``?detail=1``, every check.

    The plain answer is one ``SELECT 1``, never the broker, so that a broker or beat
    outage never takes the web processes out of the proxy's rotation. The detail names
    the broker, the queues and the open alarms and opens a broker connection, so it
    answers only the bearer of the metrics token or a staff session; anyone else gets
    401, not the plain answer, so that a monitor that lost its credentials notices. It
    is 503 when any check is red, so that monitoring can alert on the status code alone.
    """
    if request.GET.get("detail") != "1":
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return JsonResponse({"ok": True, "database": connection.vendor})
    if not (_metrics_bearer(request) or request.user.is_staff):
        return _unauthorized()
    checks = status_checks()
    ok = all(check.ok for check in checks)
    body = {
        "ok": ok,
        "checks": {
            check.name: {
                "ok": check.ok,
                "detail": check.detail,
                "at": check.at.isoformat() if check.at else None,
            }
            for check in checks
        },
    }
    return JsonResponse(body, status=200 if ok else 503)


@require_safe
def livez(request: HttpRequest) -> JsonResponse:
    """For external monitors: 200 while beat and the workers of each queue show signs of
    life within their thresholds, else 503 naming what is silent and how late it is.

    Judged from the database alone (the rows those processes write), never through the
    broker, and apart from ``/healthz``, so that a dead beat never takes the web
    processes out of the proxy's rotation. Anonymous, so that any monitor can poll it:
    it says no more than "beat: late by N s", never a queue, the broker or a figure.
    """
    try:
        roles = liveness()
    except DatabaseError:
        logger.exception("livez: reading the signs of life failed")
        response = JsonResponse({"ok": False, "silent": {"database": "unreachable"}}, status=503)
    else:
        silent = {role.name: role.late for role in roles if not role.ok}
        body: dict[str, object] = {"ok": not silent}
        if silent:
            body["silent"] = silent
        response = JsonResponse(body, status=503 if silent else 200)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_safe
def status(request: HttpRequest) -> HttpResponse:
    """The status page: every check green or red; htmx refreshes the checks."""
    checks = status_checks()
    context = {"checks": checks, "ok": all(check.ok for check in checks)}
    template = "console/status.html#checks" if request.htmx else "console/status.html"  # type: ignore[attr-defined]
    return render(request, template, context)


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus's exposition, for the bearer of ``SETTLE_METRICS_TOKEN``.

    Without a token configured it does not exist (404); a missing or wrong token is 401,
    compared in constant time.
    """
    if not settings.SETTLE_METRICS_TOKEN:
        raise Http404("no such page")
    if not _metrics_bearer(request):
        return _unauthorized()
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def _json_error(code: ErrorCode, message: str | None = None) -> JsonResponse:
    """An /api/ path's error body, as the host API answers: the code's status and text."""
    return error_response(code, message or code.message)


def forbidden(request: HttpRequest, exception: Any = None) -> HttpResponse:
    """The 403 of a page this user may not use, saying why (the refusal's own words)."""
    if _wants_json(request):
        return _json_error(ErrorCode.FORBIDDEN, str(exception or "") or None)
    reason = str(exception or "").rstrip(".")
    return render(request, "403.html", {"reason": reason}, status=403)


def not_found(request: HttpRequest, exception: Any = None) -> HttpResponse:
    if _wants_json(request):
        return _json_error(ErrorCode.NOT_FOUND)
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    # Called while the exception is handled: an outage or a cut statement is a 503.
    unavailable = database_unavailable(sys.exc_info()[1] or Exception())
    if unavailable is not None:
        if _wants_json(request):
            return _json_error(ErrorCode.DATABASE_UNAVAILABLE, unavailable)
        response = HttpResponse(loader.get_template("503.html").render(), status=503)
        response["Retry-After"] = "5"
        return response
    if _wants_json(request):
        return _json_error(ErrorCode.INTERNAL_ERROR)
    # As Django's own server_error: no request context, so no context processor (nor
    # the database it may need) runs while something is already broken.
    return HttpResponse(loader.get_template("500.html").render(), status=500)
