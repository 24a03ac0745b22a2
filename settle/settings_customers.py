"""A host's customers (parties): where their approval links point, how often a link may
be tried, and where Settle may send them a link itself."""

from __future__ import annotations

from settle.settings_env import env_bool, env_int, env_str
from settle.settings_monitoring import SETTLE_CONSOLE_URL


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list, lower-cased, without blanks."""
    return tuple(sorted({part.strip().lower() for part in text.split(",") if part.strip()}))


# The address a customer's approval link starts with (``customers.links``): the console's
# unless the customer pages are served under a name of their own.
SETTLE_CUSTOMER_URL = env_str("SETTLE_CUSTOMER_URL", SETTLE_CONSOLE_URL).rstrip("/")
# Tries of approval links (opening one's state, deciding) per client address per minute;
# past it, every try is refused with link_rate_limited and changes nothing.
SETTLE_LINK_TRIES_PER_MINUTE = env_int("SETTLE_LINK_TRIES_PER_MINUTE", 30, minimum=1)
# Settle sends a party its link through Apprise only to a contact whose scheme (e.g.
# "mailtos", "json") and server (its host name) are both listed here; empty: never.
SETTLE_PARTY_NOTIFY_SCHEMES = _names(env_str("SETTLE_PARTY_NOTIFY_SCHEMES", ""))
SETTLE_PARTY_NOTIFY_HOSTS = _names(env_str("SETTLE_PARTY_NOTIFY_HOSTS", ""))
# The outbound address checks (common.outbound) refuse a contact whose server resolves
# to a private or loopback address, unless this is on (a relay inside the network).
SETTLE_PARTY_NOTIFY_ALLOW_PRIVATE = env_bool("SETTLE_PARTY_NOTIFY_ALLOW_PRIVATE", False)

# A customer's passkey enrolment link (the host asks for one, its app delivers it) is
# good once, for this long: long enough to open it on a phone, short enough that one
# that leaked is soon worth nothing.
SETTLE_ENROLMENT_LINK_SECONDS = env_int(
    "SETTLE_ENROLMENT_LINK_SECONDS", 900, minimum=60, maximum=7 * 86400
)
