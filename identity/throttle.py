"""Who is signing in from where: the client's address, the username tried, and
django-axes' two limits on them.

The address is what the sign-in throttle keys on and what axes records for every attempt
(its access logs and lockout log lines), so each names the same client.
"""

from __future__ import annotations

from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.http import HttpRequest
from ipware import get_client_ip


def client_address(request: HttpRequest) -> str:
    """``REMOTE_ADDR``, or behind the proxy the address its trusted proxies were reached from.

    Each of the ``SETTLE_PROXY_COUNT`` proxies appends the address it was reached from to
    ``X-Forwarded-For``, so the client is that many entries from the right; whatever stands
    left of it the client wrote itself. Without the proxy the header is the client's own
    word and is ignored.
    """
    remote = str(request.META.get("REMOTE_ADDR", ""))
    if not settings.SETTLE_BEHIND_PROXY:
        return remote
    # ipware counts the proxies listed in the header: all but the one at REMOTE_ADDR.
    address, _ = get_client_ip(
        request,
        proxy_count=settings.SETTLE_PROXY_COUNT - 1,
        request_header_order=["HTTP_X_FORWARDED_FOR"],
        strict=False,
    )
    # Fewer entries than proxies: not through the proxy chain, so only the peer is known.
    return address or remote


class SignInLockoutHandler(AxesDatabaseHandler):
    """axes' database handler with a limit for each lockout parameter instead of one for all.

    ``AXES_LOCKOUT_PARAMETERS`` lists (username, address) first and the address alone
    second: the pair is refused after ``AXES_FAILURE_LIMIT`` failures, the address for every
    username after ``SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT``.
    """

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        pair, address = (
            sum(attempt.failures_since_start for attempt in attempts)
            for attempts in self.get_user_attempts(request, credentials)
        )
        if address >= settings.SETTLE_LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(int(pair), int(settings.AXES_FAILURE_LIMIT))
        return int(pair)

    def reset_user_attempts(
        self, request: HttpRequest, credentials: dict[str, Any] | None = None
    ) -> int:
        # Only the pair's own failures: signing in to one account at an address must not
        # wipe that address's failures on every other account.
        pair = self.filter_user_attempts(request, credentials)[0]
        count, _ = pair.delete()
        return int(count)


def username_of(request: HttpRequest, credentials: dict[str, Any] | None = None) -> str | None:
    """The username a sign-in tries: the console's form names it ``login`` (allauth's),
    the admin's ``username``; ``authenticate`` passes it as ``username`` either way."""
    if credentials and credentials.get("username"):
        return str(credentials["username"])
    data = getattr(request, "POST", {})
    found = data.get("login") or data.get("username")
    return str(found) if found else None
