"""The host API's rate limit per credential, counted in the shared cache.

A fixed window of ``SETTLE_HOST_RATE_BURST / SETTLE_HOST_RATE_PER_SECOND`` seconds
holds at most ``SETTLE_HOST_RATE_BURST`` requests of one credential, counted by
``common.windows`` (shared by every worker on every machine); the window's end is when
to come back (``Retry-After``).

Failing open: a cache that errors or does not answer lets the request through, logged,
and never as a refusal of the permit (the limit protects the record, not the safety
rules); the process then skips the cache for ``SKIP_SECONDS``.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.utils import timezone

from common.windows import CounterUnavailable, Window, window_count

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
    now = timezone.now()
    window = Window.at(now, max(1, math.ceil(burst / rate)))
    try:
        count = window_count(name=f"host-rate:{credential}", window=window)
    except CounterUnavailable:
        _skip_until = time.monotonic() + SKIP_SECONDS
        logger.warning(
            "rate limit skipped for %g s: the cache did not answer", SKIP_SECONDS, exc_info=True
        )
        return 0
    if count <= burst:
        return 0
    return window.seconds_left(now)
