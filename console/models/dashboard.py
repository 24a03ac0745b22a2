"""The supervisor dashboard's rollup: figures per provider and hour, where the refresh
stands, and the operations it counts as stuck."""

from __future__ import annotations

from django.db import models

from recovery.models import Operation, Provider


class DashboardRollup(models.Model):
    """One figure of the supervisor dashboard, counted for one provider and one hour.

    ``figure`` says what is counted and ``key`` which part of it: lookups by verdict,
    operator actions by action, settle times (lost lease to settled) by the bucket they
    fall in (``console.services.dashboard``). Written only by the dashboard's refresh,
    which adds the audit events of each new window once; the dashboard sums these rows
    instead of reading the audit log.
    """

    class Figure(models.TextChoices):
        LOOKUP = "lookup"
        OPERATOR = "operator"
        SETTLE = "settle"

    figure = models.CharField(max_length=10, choices=Figure.choices)
    hour = models.DateTimeField()
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=40)
    n = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            # The refresh adds to a row by this key (INSERT … ON CONFLICT); the dashboard
            # reads a figure's hours in a range through it.
            models.UniqueConstraint(
                fields=["figure", "hour", "provider", "key"], name="dashboard_rollup_key"
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.figure} {self.key} of {self.provider_id} at {self.hour:%Y-%m-%d %H}h: {self.n}"
        )


class DashboardRefresh(models.Model):
    """Where the dashboard's rollup stands: the audit events before ``through`` are in it.

    One row (``name`` "rollup"); a refresh locks it, so two refreshes never add the
    same window twice. ``waiting_at``: when ``DashboardWaiting`` was last brought up to
    date (None until its first snapshot). ``summary``: what the dashboard shows of each
    provider that is not read per hour, made by the refresh from its rows (what is stuck,
    by state, reason and age, the oldest; settle-time histograms), so that a page view
    reads one row instead of counting every stuck operation.
    """

    name = models.CharField(max_length=20, unique=True)
    through = models.DateTimeField()
    refreshed_at = models.DateTimeField()
    waiting_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.name} through {self.through:%Y-%m-%d %H:%M:%S}"


class DashboardWaiting(models.Model):
    """An operation the dashboard counts as stuck: in ``unknown`` or ``reconcile`` (``state``),
    or with its receipt stranded, or both.

    Kept by the dashboard's refresh from the audit log's transitions and receipt events,
    so that the dashboard counts these rows instead of joining operations, dispatches and
    each one's last transition. ``since``: when it entered its state (or, stranded only,
    when its lease was lost). ``state`` is blank for a settled operation whose receipt is
    still stranded.
    """

    operation = models.OneToOneField(
        Operation, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=20, blank=True)
    reason = models.CharField(max_length=40, blank=True)
    stranded = models.BooleanField(default=False)
    since = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["since"], name="dashboard_waiting_since")]

    def __str__(self) -> str:
        return f"{self.operation_id} {self.state or 'settled'} {self.reason}"
