"""Health check, the status page, /metrics and the error pages (JSON under /api/, HTML
elsewhere)."""

from __future__ import annotations

import hmac
import logging
import sys
from dataclasses import dataclass
from datetime import datetime
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
from monitoring.selectors.health import HealthFacts, health_facts, liveness

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    """One line of the status page: green or red, what it found, and since when."""

    name: str
    ok: bool
    detail: str
    at: datetime | None = None


def _database_check() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return Check("database", False, f"unreachable: {type(exc).__name__}")
    return Check("database", True, connection.vendor)


def _broker_check() -> Check:
    """Connect to the broker once, giving up within a few seconds."""
    from console.celery import app

    try:
        with app.connection_for_write() as broker:
            broker.ensure_connection(max_retries=1, interval_start=0, timeout=3)
    except Exception as exc:  # the transports raise many types
        return Check("broker", False, f"unreachable: {type(exc).__name__}")
    return Check("broker", True, str(broker.transport_cls))  # never the URL: it may hold a password


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago"


def _fact_checks(facts: HealthFacts) -> list[Check]:
    """Beat, the workers, webhook deliveries and the audit checkpoints, each red past its
    threshold."""
    sweep_limit = settings.SETTLE_STATUS_SWEEP_STALE_SECONDS
    sweep_age = facts.sweep_age
    lookup_limit = settings.SETTLE_STATUS_LOOKUP_LAG_SECONDS
    lookup_age = facts.age(facts.last_lookup_at, facts.now)
    webhook_limit = settings.SETTLE_STATUS_WEBHOOK_LAG_SECONDS
    checkpoint_limit = settings.SETTLE_STATUS_CHECKPOINT_STALE_SECONDS
    checkpoint_age = facts.checkpoint_age
    unsigned_age = facts.age(facts.oldest_unsigned_at, facts.now)
    unsigned = "every event signed"
    if unsigned_age is not None:
        unsigned = f"oldest unsigned event {_ago(unsigned_age)}"
    return [
        Check(
            "beat",
            sweep_age is not None and sweep_age <= sweep_limit,
            f"last sweep {_ago(sweep_age)} (red after {sweep_limit} s)",
            facts.last_sweep_at,
        ),
        Check(
            "workers",
            facts.lookup_lag <= lookup_limit,
            f"last lookup finished {_ago(lookup_age)}; the most overdue lookup has waited "
            f"{facts.lookup_lag:.0f} s (red after {lookup_limit} s)",
            facts.last_lookup_at,
        ),
        Check(
            "webhook deliveries",
            facts.webhook_lag <= webhook_limit,
            f"{facts.webhook_backlog} pending; the longest-waiting due message has waited "
            f"{facts.webhook_lag:.0f} s for a worker of queue {settings.SETTLE_WEBHOOK_QUEUE} "
            f"(red after {webhook_limit} s)",
            facts.oldest_due_webhook_at,
        ),
        Check(
            "audit checkpoint",
            unsigned_age is None or unsigned_age <= checkpoint_limit,
            f"newest signed {_ago(checkpoint_age)}; {unsigned} "
            f"(red when an event waits {checkpoint_limit} s unsigned)",
            facts.newest_checkpoint_at,
        ),
        _verification_check(facts),
        Check(
            "audit alarms",
            facts.open_alarms == 0,
            f"{facts.open_alarms} open audit alarms"
            + (
                ""
                if facts.checkpoint_file_problem is None
                else f"; checkpoint file incomplete: {facts.checkpoint_file_problem}"
            ),
        ),
    ]


def _verification_check(facts: HealthFacts) -> Check:
    """Red when the newest verification found a problem, or the routine or the full
    verification is late (nothing verified since its threshold, once something was
    signed that long ago)."""
    late = settings.SETTLE_AUDIT_VERIFY_LATE_SECONDS
    full_late = settings.SETTLE_AUDIT_VERIFY_FULL_LATE_SECONDS
    signed_age = facts.age(facts.first_checkpoint_at, facts.now)

    def on_time(age: float | None, limit: int) -> bool:
        if age is not None:
            return age <= limit
        return signed_age is None or signed_age <= limit

    routine_ok = on_time(facts.verified_age, late)
    full_ok = on_time(facts.full_verified_age, full_late)
    job = ""
    if facts.full_job is not None:
        job = f", a job running ({facts.full_job[0]} events in {facts.full_job[1]} slices)"
    detail = (
        f"last found intact {_ago(facts.verified_age)} (red after {late} s); fully "
        f"{_ago(facts.full_verified_age)} (red after {full_late} s){job}"
    )
    if facts.verified_age is None and routine_ok:
        # Green and "never" together read as a contradiction: say why it is not late.
        detail = (
            "not verified yet, and not due: the first verification follows the first signed "
            f"checkpoint (red {late} s after it if none ran){job}"
        )
    if facts.verify_problem is not None:
        detail = f"problem found: {facts.verify_problem}; {detail}"
    return Check(
        "audit verification",
        facts.verify_problem is None and routine_ok and full_ok,
        detail,
        facts.verified_at,
    )


def status_checks() -> list[Check]:
    """Every check of the status page, the database's first: without it the rest are red."""
    database = _database_check()
    checks = [database, _broker_check()]
    if not database.ok:
        return [*checks, Check("facts", False, "not read: the database is unreachable")]
    try:
        return checks + _fact_checks(health_facts())
    except DatabaseError as exc:
        logger.exception("status: reading the health facts failed")
        return [*checks, Check("facts", False, f"not read: {type(exc).__name__}")]


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
    return JsonResponse({"error": code, "message": message or code.message}, status=code.status)


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
