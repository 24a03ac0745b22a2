"""Request ids and log formats: every log line of a request can be found from its answer.

The id comes from the proxy's ``X-Request-ID`` when it is a sane token, else is made
here; it is returned in the response's ``X-Request-ID`` and attached to every log record
made while the request is handled.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,100}")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # X-Request-ID; read from META: ``request.headers`` builds all of them, every request.
        given = request.META.get("HTTP_X_REQUEST_ID", "")
        request_id = given if _SANE.fullmatch(given) else uuid.uuid4().hex
        token = _request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            _request_id.reset(token)
        response["X-Request-ID"] = request_id
        return response


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


class RefusalFilter(logging.Filter):
    """Keep Django's one line for a 403 and drop its traceback: a refusal is ordinary
    (an operator opening a supervisor's page), not an error to debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, request id, message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)
