"""What sign-in tells Prometheus: counters bumped where each sign-in is decided.

``settle_break_glass_sign_ins_total`` is the one an alert rule watches
(deploy/prometheus/settle-rules.yml): with single sign-on on, a password sign-in is a
superuser's break-glass, and someone should know of every one.
"""

from __future__ import annotations

from prometheus_client import Counter

SIGN_INS = Counter(
    "settle_sign_ins",
    "Console sign-ins by method (sso, password, passkey) and outcome (signed_in, failed, refused).",
    ["method", "outcome"],
)
BREAK_GLASS_SIGN_INS = Counter(
    "settle_break_glass_sign_ins",
    "Password sign-ins of superusers while single sign-on is on (break-glass).",
)
