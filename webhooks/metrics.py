"""What the webhooks tell Prometheus: one counter, bumped where each outcome commits.

/metrics exposes it with the others: in multiprocess mode every process writes its own
file and a scrape sums them, wherever the counter is defined.
"""

from __future__ import annotations

from prometheus_client import Counter

WEBHOOK_DELIVERIES = Counter(
    "settle_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered, retrying (an error; tried again "
    "later), given_up (its retry window closed), deferred (not sent: its endpoint timed "
    "out earlier in the same task) or unsent (not sent: the task's time or the claim's "
    "lease would have run out; due again at once).",
    ["outcome"],
)
