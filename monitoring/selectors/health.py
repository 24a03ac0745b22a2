"""Health facts: the few cheap, indexed reads that /metrics, the status page, /healthz and
the alert rules all start from.

Nothing here counts a whole table. What each fact reads:

last sweep
    ``Pulse`` row ``sweep``, written once per sweep by beat's task.
last finished lookup, lookups failing
    ``LookupPulse``, one row per provider, written once per lookup batch.

Those two tables are the core's (``recovery.services.runs`` writes them where the work
runs): monitoring reads them, and the core never imports monitoring.

operations by state
    live for the states an operation passes through (``IN_FLIGHT_STATES``): a count per
    (provider, state) over the ``operation_provider_state`` index, proportional to the
    operations in those states, not to the table; the terminal states from the
    ``OperationCount`` snapshot that beat refreshes every
    ``SETTLE_OPERATION_COUNTS_SECONDS``, so those figures are that old at most.
stuck
    ``unknown`` and ``reconcile``: their count and the oldest ``updated_at`` (the moment
    the operation entered its state) per provider, in the same query.
overdue lookups
    the oldest ``next_lookup_at`` of an ``unknown`` operation (``operation_lookup_due``).
newest checkpoint, unsigned events, open audit alarms
    the checkpoint with the highest number; the first event after its watermark (by
    id); the open alarms (almost always none).
last verified, last fully verified, a running full verification
    the newest ``AuditVerification`` rows (one an hour, one a day) and the unfinished
    ``AuditVerifyJob``.
webhook backlog, webhook lag
    the pending outbox messages (a count); the oldest ``next_attempt_at`` of a due
    message no worker holds (``webhook_oldest_due_at``): how long deliveries have waited
    for a worker of the webhook queue.
last verification
    the newest ``AuditVerification``, as the audit trail page shows it.
signs of life (``liveness``)
    ``Pulse`` row ``beat``, written by beat itself when it publishes a sweep, and one
    ``QueuePulse`` row per queue, written by a worker of that queue when it runs the
    queue's heartbeat: judged from these rows alone, never through the broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from audit.models import AuditAlarm, AuditCheckpoint, AuditEvent, AuditVerification, AuditVerifyJob
from monitoring.models import OperationCount, QueuePulse
from recovery.models import (
    TERMINAL_STATES,
    UNSETTLED_STATES,
    LookupPulse,
    Operation,
    Provider,
    Pulse,
    State,
)
from webhooks.selectors import webhook_oldest_due_at, webhook_outbox_backlog

IN_FLIGHT_STATES = tuple(state for state in State if state not in TERMINAL_STATES)


@dataclass
class ProviderFacts:
    """One provider's figures."""

    id: int
    name: str
    # Operations by state: in-flight states live, terminal ones from the snapshot.
    states: dict[str, int] = field(default_factory=dict)
    # Per stuck state (unknown, reconcile): when its longest-waiting operation entered it.
    oldest_stuck_at: dict[str, datetime] = field(default_factory=dict)
    last_lookup_at: datetime | None = None
    unavailable_since: datetime | None = None

    @property
    def stuck(self) -> int:
        return sum(self.states.get(state, 0) for state in UNSETTLED_STATES)

    @property
    def oldest_stuck(self) -> datetime | None:
        return min(self.oldest_stuck_at.values(), default=None)


@dataclass
class HealthFacts:
    """Everything the signals read, as of ``now``."""

    now: datetime
    last_sweep_at: datetime | None
    last_sweep_seconds: float | None
    counts_at: datetime | None
    last_lookup_at: datetime | None
    oldest_due_lookup_at: datetime | None
    newest_checkpoint_at: datetime | None
    # The oldest audit event no checkpoint signed yet (None: every event is signed).
    oldest_unsigned_at: datetime | None
    open_alarms: int
    # Why the checkpoint file lacks a signed checkpoint (an open ``checkpoint_file``
    # alarm's reason), None when it is whole.
    checkpoint_file_problem: str | None
    webhook_backlog: int
    oldest_due_webhook_at: datetime | None
    providers: list[ProviderFacts]
    last_verification_at: datetime | None = None
    last_verification_ok: bool | None = None
    # Verification (``audit.verification``): when the newest verification that found
    # the log intact finished (routine or full), the newest full one's, and the problem
    # the newest verification found (None: it found none). The first checkpoint's time:
    # a log never verified is late only that long after something was signed.
    verified_at: datetime | None = None
    full_verified_at: datetime | None = None
    verify_problem: str | None = None
    first_checkpoint_at: datetime | None = None
    # The running full verification job: (events checked so far, slices run), or None.
    full_job: tuple[int, int] | None = None

    @staticmethod
    def age(moment: datetime | None, now: datetime) -> float | None:
        return None if moment is None else max(0.0, (now - moment).total_seconds())

    @property
    def sweep_age(self) -> float | None:
        return self.age(self.last_sweep_at, self.now)

    @property
    def lookup_lag(self) -> float:
        """How long the most overdue lookup has been waiting (0 when none is due)."""
        if self.oldest_due_lookup_at is None or self.oldest_due_lookup_at > self.now:
            return 0.0
        return (self.now - self.oldest_due_lookup_at).total_seconds()

    @property
    def webhook_lag(self) -> float:
        """How long the longest-waiting due webhook message has waited (0 when none is)."""
        return self.age(self.oldest_due_webhook_at, self.now) or 0.0

    @property
    def checkpoint_age(self) -> float | None:
        return self.age(self.newest_checkpoint_at, self.now)

    @property
    def unsigned_age(self) -> float:
        """How long the oldest event no checkpoint signed has waited (0: every one is)."""
        return self.age(self.oldest_unsigned_at, self.now) or 0.0

    @property
    def verified_age(self) -> float | None:
        """Seconds since a verification last found the log intact (None: never)."""
        return self.age(self.verified_at, self.now)

    @property
    def full_verified_age(self) -> float | None:
        return self.age(self.full_verified_at, self.now)


def health_facts(*, now: datetime | None = None) -> HealthFacts:
    """The facts for every provider (the system's view: metrics and alerts, not a user's)."""
    now = now or timezone.now()
    providers = {
        provider.pk: ProviderFacts(provider.pk, provider.name)
        for provider in Provider.objects.order_by("name")
    }
    live = (
        Operation.objects.filter(provider_id__in=list(providers), state__in=IN_FLIGHT_STATES)
        .values("provider_id", "state")
        .annotate(count=Count("*"), oldest=Min("updated_at"))
        .order_by()
    )
    for row in live:
        facts = providers[row["provider_id"]]
        facts.states[row["state"]] = row["count"]
        if row["state"] in UNSETTLED_STATES:
            facts.oldest_stuck_at[row["state"]] = row["oldest"]
    for count in OperationCount.objects.filter(state__in=TERMINAL_STATES):
        if count.provider_id in providers:
            providers[count.provider_id].states[count.state] = count.count
    lookups = list(LookupPulse.objects.all())
    for pulse in lookups:
        if pulse.provider_id in providers:
            providers[pulse.provider_id].last_lookup_at = pulse.last_lookup_at
            providers[pulse.provider_id].unavailable_since = pulse.unavailable_since
    pulses = {pulse.name: pulse for pulse in Pulse.objects.all()}
    sweep = pulses.get(Pulse.Name.SWEEP)
    counts = pulses.get(Pulse.Name.OPERATION_COUNTS)
    due = (
        Operation.objects.filter(state=State.UNKNOWN, next_lookup_at__isnull=False)
        .order_by("next_lookup_at")
        .values_list("next_lookup_at", flat=True)
        .first()
    )
    checkpoint = AuditCheckpoint.objects.order_by("-number").values("made_at", "watermark").first()
    verification = AuditVerification.objects.order_by("-at", "-id").values("at", "ok").first()
    watermark = checkpoint["watermark"] if checkpoint else 0
    unsigned = (
        AuditEvent.objects.filter(id__gt=watermark).order_by("id").values_list("at", flat=True)
    )
    health = HealthFacts(
        now=now,
        last_sweep_at=sweep.at if sweep else None,
        last_sweep_seconds=sweep.seconds if sweep else None,
        counts_at=counts.at if counts else None,
        last_lookup_at=max((pulse.last_lookup_at for pulse in lookups), default=None),
        oldest_due_lookup_at=due,
        newest_checkpoint_at=checkpoint["made_at"] if checkpoint else None,
        oldest_unsigned_at=unsigned.first(),
        open_alarms=AuditAlarm.objects.filter(resolved_at__isnull=True).count(),
        checkpoint_file_problem=AuditAlarm.objects.filter(
            kind=AuditAlarm.Kind.CHECKPOINT_FILE, resolved_at__isnull=True
        )
        .values_list("reason", flat=True)
        .first(),
        webhook_backlog=webhook_outbox_backlog(),
        oldest_due_webhook_at=webhook_oldest_due_at(now=now),
        providers=list(providers.values()),
        last_verification_at=verification["at"] if verification else None,
        last_verification_ok=verification["ok"] if verification else None,
    )
    return _verification_facts(health)


def _verification_facts(facts: HealthFacts) -> HealthFacts:
    """Fill the verification fields of ``facts``: a few rows, newest first."""
    intact = AuditVerification.objects.filter(ok=True).order_by("-at", "-id")
    newest = AuditVerification.objects.order_by("-at", "-id").values_list("ok", "problem").first()
    job = (
        AuditVerifyJob.objects.exclude(phase=AuditVerifyJob.Phase.DONE)
        .values_list("events_checked", "slices")
        .first()
    )
    facts.verified_at = _finished(intact.values_list("at", "finished_at").first())
    facts.full_verified_at = _finished(
        intact.filter(scope=AuditVerification.Scope.FULL).values_list("at", "finished_at").first()
    )
    facts.verify_problem = newest[1] if newest and not newest[0] else None
    facts.first_checkpoint_at = (
        AuditCheckpoint.objects.filter(number=1).values_list("made_at", flat=True).first()
    )
    facts.full_job = (int(job[0]), int(job[1])) if job else None
    return facts


def _finished(row: tuple[datetime, datetime | None] | None) -> datetime | None:
    return None if row is None else row[1] or row[0]


@dataclass(frozen=True)
class Liveness:
    """One process role's sign of life: how long ago it was seen, and its threshold."""

    name: str  # "beat", "lookup workers", "webhook workers": never a queue's name
    role: str  # the metrics' label: beat, lookups, webhooks
    queue: str | None
    age: float | None  # None: never seen
    limit: int

    @property
    def ok(self) -> bool:
        return self.age is not None and self.age <= self.limit

    @property
    def late(self) -> str:
        """What /livez says of it: no more than how late it is."""
        if self.age is None:
            return "never seen"
        return f"late by {max(0.0, self.age - self.limit):.0f} s"


def liveness(*, now: datetime | None = None) -> list[Liveness]:
    """Beat and the workers of each queue Settle uses, each seen how long ago.

    Two indexed reads of a few rows: cheap enough for any monitor's polling.
    """
    now = now or timezone.now()
    lookups = settings.CELERY_TASK_DEFAULT_QUEUE
    webhooks = settings.SETTLE_WEBHOOK_QUEUE
    beat_at = Pulse.objects.filter(name=Pulse.Name.BEAT).values_list("at", flat=True).first()
    seen = dict(QueuePulse.objects.filter(queue__in={lookups, webhooks}).values_list("queue", "at"))
    queues = [("workers", "workers", lookups)]
    if webhooks != lookups:
        queues = [("lookup workers", "lookups", lookups), ("webhook workers", "webhooks", webhooks)]
    beat_limit = settings.SETTLE_LIVENESS_BEAT_SECONDS
    worker_limit = settings.SETTLE_LIVENESS_WORKER_SECONDS
    return [
        Liveness("beat", "beat", None, HealthFacts.age(beat_at, now), beat_limit),
        *(
            Liveness(name, role, queue, HealthFacts.age(seen.get(queue), now), worker_limit)
            for name, role, queue in queues
        ),
    ]


def reconcile_entered_since(*, since: datetime, provider_id: int | None) -> int:
    """Operations that entered ``reconcile`` after ``since`` (the unsettled index's range)."""
    rows = Operation.objects.filter(state=State.RECONCILE, updated_at__gt=since)
    if provider_id is not None:
        rows = rows.filter(provider_id=provider_id)
    return rows.count()
