"""What every customer page answers with, whatever the view: strict CSP, no caching, no
``Referer``.

A customer page is reached by a link whose token is the only key: nothing of it may be
kept by a cache, leak to another site through ``Referer``, or run a script or style
Settle did not serve itself.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse

# Self only, nothing inline: scripts, styles, images and fetches from Settle itself.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


def customer_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Answer with ``HEADERS`` (an answer of the view's own, errors included)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        for name, value in HEADERS.items():
            response[name] = value
        return response

    return wrapper
