"""What monitoring keeps: queues' signs of life, the operation count snapshot, alert rules,
the messages owed to approvers.

The rows the core writes about its own work (``recovery.models.Pulse``, when each
periodic job last finished; ``LookupPulse``, how each provider's lookups go) stay
in ``recovery``: they are written inside the core's work, and monitoring only reads them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from approvals.models import Approval
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


class ApprovalNotice(models.Model):
    """One message owed to one channel tag about one approval (``approval_notices``).

    Written when a run claims the approval (opened, reminder, escalation), or with the
    approval's expiry, in its transaction (expired); sent by a run, grouped with every
    other notice due for the same tag, after the commit. ``claimed_until``: a run is
    sending it until then (one that died leaves it to the next run after). A send that
    failed keeps its error and is tried again by the next run; one that can no longer
    matter (its approval decided before the opening went out, or a day old) is dropped.
    """

    class Kind(models.TextChoices):
        OPENED = "opened"
        REMINDER = "reminder"
        ESCALATION = "escalation"
        EXPIRED = "expired"

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        DROPPED = "dropped"

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    tag = models.CharField(max_length=150)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    send_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "kind", "tag"], name="approval_notice_once"
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="pending"),
                name="approval_notice_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of {self.approval_id} to {self.tag} ({self.status})"
