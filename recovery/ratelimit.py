"""The host API's rate limit per credential, counted in the shared cache.

A fixed window of ``SETTLE_HOST_RATE_BURST / SETTLE_HOST_RATE_PER_SECOND`` seconds
holds at most ``SETTLE_HOST_RATE_BURST`` requests of one credential: the counter is one
cache key per credential and window, created with ``add`` and counted with ``incr``,
both atomic on Redis, so every gunicorn worker on every machine counts against the same
limit. It is the scheme django-ratelimit uses, written out here because the API must
say when to come back (``Retry-After``) and must fail open.

Failing open: a cache that errors or does not answer lets the request through, logged,
and never as a refusal of the permit (the limit protects the record, not the safety
rules); the process then skips the cache for ``SKIP_SECONDS``.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.core.cache import caches

logger = logging.getLogger("settle.api")

# After the cache fails, this process skips it this long: a hung cache costs one request
# its timeout, not every request.
SKIP_SECONDS = 5.0
_skip_until = 0.0


def rate_limit_wait(*, credential: str) -> int:
    """0 if ``credential`` may make one more request now, else the seconds to wait.

    ``credential``: a stable name of the credential (its token's hash), never the token.
    """
    rate = settings.SETTLE_HOST_RATE_PER_SECOND
    burst = settings.SETTLE_HOST_RATE_BURST
    global _skip_until
    if rate <= 0 or time.monotonic() < _skip_until:
        return 0
    window = max(1, math.ceil(burst / rate))
    now = time.time()
    start = int(now // window) * window
    key = f"host-rate:{credential}:{start}"
    try:
        cache = caches["default"]
        cache.add(key, 0, timeout=window + 1)
        count = cache.incr(key)
    except ValueError:
        return 0  # the window's key expired between add and incr: a new window began
    except Exception:
        _skip_until = time.monotonic() + SKIP_SECONDS
        logger.warning(
            "rate limit skipped for %g s: the cache did not answer", SKIP_SECONDS, exc_info=True
        )
        return 0
    if count <= burst:
        return 0
    return max(1, math.ceil(start + window - now))
