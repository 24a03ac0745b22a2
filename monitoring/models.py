"""What monitoring keeps: queues' signs of life, the operation count snapshot, alert rules.

The rows the core writes about its own work (``recovery.models.Pulse``, when each
periodic job last finished; ``LookupPulse``, how each provider's lookups go) stay
in ``recovery``: they are written inside the core's work, and monitoring only reads them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from recovery.models import Provider, State


class QueuePulse(models.Model):
    """When a worker of one Celery queue last ran that queue's heartbeat task.

    Every worker publishes a heartbeat to each queue it consumes every
    ``SETTLE_WORKER_HEARTBEAT_SECONDS``, and whichever worker of the queue runs it
    writes this row: the queue is served, judged without the broker. ``waited`` is how
    long that heartbeat waited in the queue.
    """

    queue = models.CharField(max_length=200, unique=True)
    at = models.DateTimeField()
    waited = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.queue} at {self.at:%Y-%m-%d %H:%M:%S}"


class OperationCount(models.Model):
    """How many operations one provider had in one state when beat last counted.

    A snapshot for the terminal states, whose counts grow without bound: ``/metrics``
    reads these few rows instead of counting a million on every scrape.
    """

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=20, choices=State.choices)
    count = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "state"], name="operation_count_one_row"),
        ]

    def __str__(self) -> str:
        return f"{self.provider_id} {self.state}: {self.count}"


class AlertRule(models.Model):
    """A condition worth telling operators about, and where to tell them (Apprise URLs).

    ``threshold`` is minutes or a number of operations, by ``kind``; a rule without a
    provider watches every provider together. While the condition holds, one message
    goes out per ``window_minutes``; when it clears, one "resolved" message.
    """

    class Kind(models.TextChoices):
        RECONCILE_ENTERED = "reconcile_entered", "An operation entered reconcile"
        STUCK_OLDEST = "stuck_oldest", "Oldest stuck operation older than N minutes"
        STUCK_COUNT = "stuck_count", "More than N operations stuck"
        LOOKUPS_FAILING = "lookups_failing", "Lookups unavailable for N minutes"
        NO_SWEEP = "no_sweep", "No sweep for N minutes"
        AUDIT_BROKEN = "audit_broken", "Audit log broken (an open alarm)"

    name = models.CharField(max_length=100, unique=True)
    provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    threshold = models.PositiveIntegerField(
        default=1, help_text="Minutes, or a number of operations, as the kind says."
    )
    # Apprise URLs, one per line; they carry channel secrets, so no page shows them back.
    urls = models.TextField()
    window_minutes = models.PositiveIntegerField(default=60)
    enabled = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(window_minutes__gte=1), name="alert_rule_window_min"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def url_list(self) -> list[str]:
        return [line.strip() for line in self.urls.splitlines() if line.strip()]


class AlertState(models.Model):
    """Where one rule stands: firing since when, last told when, resolved when."""

    rule = models.OneToOneField(
        AlertRule, on_delete=models.CASCADE, primary_key=True, related_name="state"
    )
    evaluated_at = models.DateTimeField()
    firing_since = models.DateTimeField(null=True, blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    summary = models.TextField(blank=True)
    send_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.rule_id}: {'firing' if self.firing_since else 'quiet'}"
