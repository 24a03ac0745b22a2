"""Operations, dispatches, host receipts, evidence and lookups."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from audit.models import ChainHolder
from common.actors import ActorField
from recovery.permissions import ProviderPermission


class Host(models.Model):
    """A worker fleet that calls the host API with a bearer token (stored hashed)."""

    name = models.CharField(max_length=100, unique=True)
    # Who asks, as the host's customers know it (the approval link's page); blank: name.
    display_name = models.CharField(max_length=200, blank=True)
    token_hash = models.CharField(max_length=71, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # A disabled host's token answers 401 from its next request on; hosts are kept,
    # never deleted, because operations and the audit log refer to them.
    disabled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    @property
    def shown_name(self) -> str:
        return self.display_name or self.name

    @property
    def active(self) -> bool:
        return self.disabled_at is None


class Provider(models.Model):
    """A backend that performs effects; Settle only ever reads it, through its adapter."""

    class Adapter(models.TextChoices):
        SQLITE = "sqlite"
        JOURNAL = "journal"
        HTTP = "http"
        MCP = "mcp"

    name = models.CharField(max_length=100, unique=True)
    adapter = models.CharField(max_length=16, choices=Adapter.choices)
    path = models.CharField(max_length=500, blank=True)
    url = models.CharField(max_length=500, blank=True)
    # An mcp provider's secret is a JSON description of its server (recovery.adapters.mcp).
    secret = models.CharField(max_length=4000, blank=True)
    timeout_seconds = models.FloatField(default=5.0)
    lease_seconds = models.PositiveIntegerField(default=60)
    lookup_budget = models.PositiveIntegerField(
        default=5, help_text="Inconclusive lookups (absent/unavailable) before reconcile."
    )
    absent_is_authoritative = models.BooleanField(
        default=False,
        help_text=(
            "The provider's record is complete: an operation it has no record of was not "
            "performed, so an operator may void it on 'absent' evidence without a second "
            "operator. Leave off unless the provider writes its record before any effect."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        permissions: ClassVar[list[tuple[str, Any]]] = ProviderPermission.choices
        constraints = [
            models.CheckConstraint(
                condition=Q(timeout_seconds__gt=0) & Q(timeout_seconds__lte=60),
                name="provider_timeout_range",
            ),
            models.CheckConstraint(condition=Q(lease_seconds__gte=1), name="provider_lease_min"),
        ]

    def __str__(self) -> str:
        return self.name


class State(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    DISPATCHED = "dispatched"
    RELEASED = "released"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILE = "reconcile"
    VOIDED = "voided"
    DENIED = "denied"
    EXPIRED = "expired"
    REVOKED = "revoked"


TERMINAL_STATES = frozenset(
    {State.RELEASED, State.FAILED, State.VOIDED, State.DENIED, State.EXPIRED, State.REVOKED}
)
# What waits for an operator (the queue, the dashboard's "stuck"): an operation in one
# of these states; and a receipt still running while its operation is in none of
# ``RECEIPT_MAY_RUN_STATES`` (a dispatch in flight, or an operation waiting anyway) is
# stranded, and waits too.
UNSETTLED_STATES = (State.UNKNOWN, State.RECONCILE)
RECEIPT_MAY_RUN_STATES = (State.DISPATCHED, *UNSETTLED_STATES)


class Operation(ChainHolder):
    """One intended effect, persisted before anything is dispatched.

    It keeps the head of its own audit chain (``ChainHolder``).

    ``state`` and ``version`` change only through ``recovery.transitions``.
    """

    key = models.CharField(max_length=200, unique=True)
    # No index of its own: an operation is always found by its key (its host is then a
    # condition on that one row), and an index here only cost every write and let the
    # planner, on a table it had not analyzed yet, read a host's every operation to find one.
    host = models.ForeignKey(
        Host, on_delete=models.PROTECT, related_name="operations", db_index=False
    )
    action = models.CharField(max_length=200)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="operations")
    params_canonical = models.TextField()
    params_digest = models.CharField(max_length=71)
    state = models.CharField(max_length=20, choices=State.choices)
    version = models.PositiveIntegerField(default=1)
    recovered = models.BooleanField(default=False)
    lookups_inconclusive = models.PositiveIntegerField(default=0)
    next_lookup_at = models.DateTimeField(null=True, blank=True)
    last_callback_sequence = models.BigIntegerField(null=True, blank=True)
    # Whether the dispatch's receipt was still running when the operation last changed
    # state (set by ``recovery.transitions``; False when that change completes the
    # receipt too). Never False while a receipt is stranded, sometimes True after it
    # was completed without a transition: only ``operation_stranded``'s index reads
    # it, to find the few settled operations whose receipt may be stranded without
    # reading every running receipt. The receipt itself says whether it is.
    receipt_running = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # The console queue and the sweeper read only unsettled rows.
            models.Index(
                fields=["state", "updated_at", "id"],
                condition=Q(state__in=["unknown", "reconcile"]),
                # Bulk work counts every matching operation of the providers a user may
                # view: from the index alone (PostgreSQL), not a heap read per row.
                include=["provider_id"],
                name="operation_unsettled",
            ),
            # The queue's stranded receipts of settled operations, oldest first.
            models.Index(
                fields=["updated_at", "id"],
                condition=Q(receipt_running=True)
                & ~Q(state__in=[state.value for state in RECEIPT_MAY_RUN_STATES]),
                name="operation_stranded",
            ),
            # The sweeper's due lookups in its order; with the id, the queue's count of
            # unknown operations' stranded receipts reads this index alone.
            models.Index(
                fields=["next_lookup_at", "id"],
                condition=Q(state="unknown"),
                name="operation_lookup_due",
            ),
            models.Index(fields=["provider", "state"], name="operation_provider_state"),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def params(self) -> Any:
        return json.loads(self.params_canonical)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Leased:
    """A row that holds something until ``lease_expires_at``: a dispatch (its worker, kept
    by heartbeats), a lookup attempt in flight (its operation's one lookup slot)."""

    lease_expires_at: datetime

    def lease_alive(self, now: datetime) -> bool:
        """Held until the expiry, not at it: at that moment the lease has lapsed."""
        return self.lease_expires_at > now


class Dispatch(Leased, models.Model):
    """The one recorded attempt, and the host's receipt of it, in one row.

    Created in the transaction that consumes the permit, with the receipt ``running``.
    The receipt's first report wins; a worker that dies leaves it ``running`` (a
    stranded receipt) until verified evidence completes it (``receipt_recovered``,
    pointing at that evidence). Dispatch and receipt are one-to-one and change under
    the same lock, so they share a row: one insert per dispatch.
    """

    class ReceiptStatus(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="dispatch")
    permit_id = models.UUIDField(unique=True)
    fencing_token = models.CharField(max_length=64, unique=True)
    worker = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    receipt_status = models.CharField(
        max_length=10, choices=ReceiptStatus.choices, default=ReceiptStatus.RUNNING
    )
    receipt_reference = models.CharField(max_length=200, blank=True)
    receipt_recovered = models.BooleanField(default=False)
    receipt_evidence = models.ForeignKey(
        "Evidence", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Or, where no evidence backed it, the four-eyes decision it was completed by.
    receipt_request = models.ForeignKey(
        "approvals.ReconciliationRequest",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    receipt_reported_at = models.DateTimeField(null=True, blank=True)
    # What the effect returned, as the host reported it (``ResultRequest.result``, at most
    # ``common.canonical.MAX_RESULT_BYTES`` canonical): a repeat of the call with the same
    # key answers it without running the effect again (settle-mcp's tool results).
    receipt_result = models.JSONField(null=True, blank=True)

    class Meta:
        # One dispatch per operation, ever: the one-to-one field's own unique index.
        constraints = [
            # A recovery receipt points at what it was built from.
            models.CheckConstraint(
                condition=Q(receipt_recovered=False)
                | Q(receipt_evidence__isnull=False)
                | Q(receipt_request__isnull=False),
                name="receipt_recovery_has_grounds",
            ),
        ]
        indexes = [
            models.Index(fields=["lease_expires_at"], name="dispatch_lease"),
            # A search by the provider's reference (``operation_jump_for_user``).
            models.Index(
                fields=["receipt_reference"],
                condition=~Q(receipt_reference=""),
                name="receipt_reference",
            ),
            models.Index(
                fields=["operation"],
                condition=Q(receipt_status="running"),
                name="receipt_running",
            ),
        ]

    def __str__(self) -> str:
        return f"dispatch of {self.operation_id}"

    @property
    def receipt_running(self) -> bool:
        """Whether its receipt still runs: stranded once no worker can still report it
        (the operation's state says when: ``RECEIPT_MAY_RUN_STATES``)."""
        return self.receipt_status == self.ReceiptStatus.RUNNING

    @classmethod
    def of(cls, operation: Operation) -> Dispatch | None:
        """The operation's one dispatch as the database holds it now, or None before one.

        Read afresh, unlike the reverse accessor ``operation.dispatch``, which caches.
        """
        return cls.objects.filter(operation=operation).first()


def receipt_stranded(*, state: str, receipt_status: str | None) -> bool:
    """Whether a receipt is stranded: still running while its operation is past
    ``dispatched``, so that no worker will report it.

    The queue's mark, the operation page's badge and the decisions' test alike;
    ``receipt_running_sql`` is the running half of it in a statement, whose own
    condition on the state is the other.
    """
    return receipt_status == Dispatch.ReceiptStatus.RUNNING and state != State.DISPATCHED


def receipt_running_sql(row: str, *, value: bool = False) -> str:
    """SQL: whether the receipt of the operation row ``row`` (an alias) is still running.

    As a condition (the default), a scalar read of the ``receipt_running`` index alone,
    row by row: the planner makes an EXISTS a join, which hashes every running receipt
    before the first row. As a ``value`` to write, an EXISTS: true or false, never NULL.
    """
    found = (
        f"FROM {Dispatch._meta.db_table} d WHERE d.operation_id = {row}.id"
        f" AND d.receipt_status = '{Dispatch.ReceiptStatus.RUNNING.value}'"
    )
    if value:
        return f"EXISTS (SELECT 1 {found})"
    return f"(SELECT d.operation_id {found} LIMIT 1) = {row}.id"


def claim_cutoff(now: datetime | None = None) -> datetime:
    """Claims last touched before this have lapsed: the one statement of that rule."""
    idle = timedelta(minutes=settings.SETTLE_CLAIM_IDLE_MINUTES)
    return (now or timezone.now()) - idle


class OperationClaimQuerySet(models.QuerySet["OperationClaim"]):
    def live(self) -> OperationClaimQuerySet:
        """The claims that have not lapsed (``claim_cutoff``)."""
        return self.filter(touched_at__gt=claim_cutoff())


class OperationClaim(models.Model):
    """An operator working on an operation, so that a second one does not.

    A claim lapses by itself once its holder has been idle (no action on the operation)
    for ``SETTLE_CLAIM_IDLE_MINUTES``; a lapsed claim is as good as none and is replaced
    by the next one taken.
    """

    operation = models.OneToOneField(
        Operation, on_delete=models.PROTECT, primary_key=True, related_name="claim"
    )
    actor = ActorField(blank=False)
    claimed_at = models.DateTimeField()
    touched_at = models.DateTimeField()

    objects = OperationClaimQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.operation_id} claimed by {self.actor}"

    @property
    def lapsed(self) -> bool:
        return self.touched_at <= claim_cutoff()


class Verdict(models.TextChoices):
    MATCH = "match"
    MISMATCH = "mismatch"
    CORRUPT = "corrupt"
    ABSENT = "absent"
    UNAVAILABLE = "unavailable"


class Evidence(models.Model):
    """What the provider's own record said, captured once; never edited."""

    class Source(models.TextChoices):
        LOOKUP = "lookup"
        CALLBACK = "callback"

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="evidence")
    source = models.CharField(max_length=10, choices=Source.choices)
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    provider_status = models.CharField(max_length=16, blank=True)
    provider_reference = models.CharField(max_length=200, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    raw = models.JSONField(default=dict)
    raw_digest = models.CharField(max_length=71)
    captured_at = models.DateTimeField()
    # The provider's ``absent_is_authoritative`` when this was captured: whether an
    # ``absent`` here backs a void by itself, however the provider is configured later.
    absent_is_authoritative = models.BooleanField(default=False)

    class Meta:
        ordering = ["captured_at", "id"]
        indexes = [
            models.Index(fields=["operation", "captured_at"], name="evidence_operation"),
            # A search by the provider's reference (``operation_jump_for_user``).
            models.Index(
                fields=["provider_reference"],
                condition=~Q(provider_reference=""),
                name="evidence_provider_reference",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} for {self.operation_id}"


class LookupAttempt(Leased, models.Model):
    """One look at the provider's record; the evidence it produced hangs off it.

    At most one attempt per operation is in flight (``queued`` or ``running``) at a time.
    An attempt in flight holds a lease: a queued one until a background worker must have
    picked it up, a running one until its lookup must have ended. One whose lease lapsed
    (its message was lost, its process died mid-lookup) is ``abandoned`` by the next
    attempt rather than waited for forever.
    """

    class Trigger(models.TextChoices):
        RESUME = "resume"
        TASK = "task"
        OPERATOR = "operator"

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINISHED = "finished"
        ABANDONED = "abandoned"

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="lookups")
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    evidence = models.OneToOneField(
        Evidence, null=True, blank=True, on_delete=models.PROTECT, related_name="lookup"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation"],
                condition=Q(status__in=["queued", "running"]),
                name="lookup_one_in_flight_per_operation",
            ),
        ]
        indexes = [models.Index(fields=["operation", "started_at"], name="lookup_operation")]

    def __str__(self) -> str:
        return f"lookup {self.pk} of {self.operation_id}"


# An attempt in these holds its operation's one lookup slot (while its lease lasts).
LOOKUP_IN_FLIGHT = (LookupAttempt.Status.QUEUED, LookupAttempt.Status.RUNNING)


class Pulse(models.Model):
    """When a periodic job last finished, one row per job (``name``), updated in place.

    Written once per run, not per operation, so that "is beat still sweeping?" is one
    indexed read. ``seconds`` is how long that run took. Written through
    ``recovery.services.runs.pulse_record`` (by the sweep, by beat, and by monitoring's
    count snapshot); read by ``monitoring``.
    """

    class Name(models.TextChoices):
        SWEEP = "sweep"
        OPERATION_COUNTS = "operation_counts"
        # Written by beat itself each time it publishes a sweep: beat's sign of life,
        # whether or not a worker runs the sweep.
        BEAT = "beat"

    name = models.CharField(max_length=40, choices=Name.choices, unique=True)
    at = models.DateTimeField()
    seconds = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.name} at {self.at:%Y-%m-%d %H:%M:%S}"


class LookupPulse(models.Model):
    """How a provider's lookups have been going: one row per provider, updated per batch.

    ``unavailable_since`` is set by the first ``unavailable`` answer after an available
    one and cleared by the next answer that is not ``unavailable``: "lookups failing for
    N minutes" without reading the evidence table.
    """

    provider = models.OneToOneField(
        Provider, on_delete=models.CASCADE, primary_key=True, related_name="lookups_pulse"
    )
    last_lookup_at = models.DateTimeField()
    last_available_at = models.DateTimeField(null=True, blank=True)
    unavailable_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"lookups of {self.provider_id}"
