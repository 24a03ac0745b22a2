"""What every customer page and answer shares: its safety headers, its language, and the
limit on how often one address may try links.

headers
    A strict Content-Security-Policy (this origin's own scripts, styles and images,
    nothing inline, no framing), ``Cache-Control: no-store`` (an approval's details stay
    off shared and back-button caches), ``Referrer-Policy: no-referrer``.
language
    The browser's (``Accept-Language``) among ``settings.LANGUAGES``, on these pages only:
    the console stays in English.
tries
    ``SETTLE_LINK_TRIES_PER_MINUTE`` per client address (``common.windows``), counted on
    every POST; past it, ``link_rate_limited``, logged and counted, and nothing is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone, translation
from django.utils.cache import patch_vary_headers

from common.errors import ErrorCode, SettleError
from common.windows import CounterUnavailable, Window, window_count
from customers.metrics import LINK_REFUSALS
from identity.throttle import client_address

logger = logging.getLogger("settle.customers")

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)


class LinkRefused(SettleError):
    """A try refused before any approval was known: a bad token, too many tries."""


def link_refusal_record(code: ErrorCode, request: HttpRequest) -> None:
    """A log line and a metric: with no approval known, no audit chain can hold it."""
    LINK_REFUSALS.labels(code=str(code)).inc()
    logger.warning("approval link refused: %s from %s", code, client_address(request))


def tries_count(request: HttpRequest) -> None:
    """Count one try of a link from this address; ``LinkRefused`` past the limit."""
    address = client_address(request)
    try:
        tries = window_count(name=f"link-tries:{address}", window=Window.at(timezone.now(), 60))
    except CounterUnavailable:
        # 128 unguessable bits stand without the counter; the tries are still refused
        # per approval (its chain records each).
        logger.warning("approval link tries uncounted: the cache did not answer")
        return
    if tries > settings.SETTLE_LINK_TRIES_PER_MINUTE:
        link_refusal_record(ErrorCode.LINK_RATE_LIMITED, request)
        raise LinkRefused(ErrorCode.LINK_RATE_LIMITED)


def customer_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The customer's language for the view's strings, and the safety headers on its
    answer, whatever it is."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        language = translation.get_language_from_request(request)
        with translation.override(language):
            response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response["Cache-Control"] = "no-store"
        response["Referrer-Policy"] = "no-referrer"
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Language"] = language
        patch_vary_headers(response, ["Accept-Language"])
        return response

    return wrapper
