"""What the customer pages count for /metrics: link tries refused before any approval
was known (a bad token, too many tries), which no audit chain can hold."""

from __future__ import annotations

from prometheus_client import Counter

LINK_REFUSALS = Counter(
    "settle_approval_link_refusals",
    "Approval-link tries refused before an approval was known, by code.",
    ["code"],
)
