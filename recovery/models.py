"""Operations, dispatches, host receipts, evidence, lookups and the audit log."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q

from approvals.actors import ActorField
from recovery.permissions import ProviderPermission


class Host(models.Model):
    """A worker fleet that calls the host API with a bearer token (stored hashed)."""

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=71, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # A disabled host's token answers 401 from its next request on; hosts are kept,
    # never deleted, because operations and the audit log refer to them.
    disabled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    @property
    def active(self) -> bool:
        return self.disabled_at is None


class Provider(models.Model):
    """A backend that performs effects; Settle only ever reads it, through its adapter."""

    class Adapter(models.TextChoices):
        SQLITE = "sqlite"
        JOURNAL = "journal"
        HTTP = "http"

    name = models.CharField(max_length=100, unique=True)
    adapter = models.CharField(max_length=16, choices=Adapter.choices)
    path = models.CharField(max_length=500, blank=True)
    url = models.CharField(max_length=500, blank=True)
    secret = models.CharField(max_length=200, blank=True)
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
UNSETTLED_STATES = (State.UNKNOWN, State.RECONCILE)


class Operation(models.Model):
    """One intended effect, persisted before anything is dispatched.

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
    # The head of this operation's audit chain (``recovery.audit``): read with the row's
    # lock, written with the change it describes. Checkpoints, not this, vouch for it.
    audit_seq = models.BigIntegerField(default=0)
    audit_hash = models.CharField(max_length=71, blank=True)
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
                & ~Q(state__in=["dispatched", "unknown", "reconcile"]),
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

    @classmethod
    def of(cls, operation: Operation) -> Dispatch | None:
        """The operation's one dispatch as the database holds it now, or None before one.

        Read afresh, unlike the reverse accessor ``operation.dispatch``, which caches.
        """
        return cls.objects.filter(operation=operation).first()


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

    def __str__(self) -> str:
        return f"{self.operation_id} claimed by {self.actor}"


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


class AuditEvent(models.Model):
    """Append-only, hash-chained record of everything that happened.

    Each operation has a chain of its own (``operation_key``; ``""`` is the chain of
    events that belong to no operation): ``seq`` counts from 1 within the chain and
    ``hash`` = sha256(prev_hash + canonical JSON of the event's content). ``id`` orders
    events across chains. See ``recovery.audit``.
    """

    seq = models.BigIntegerField()
    at = models.DateTimeField()
    kind = models.CharField(max_length=40)
    operation_key = models.CharField(max_length=200, blank=True)
    actor = ActorField()
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=71)
    hash = models.CharField(max_length=71)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Two writers can never fork a chain: the second append at a seq fails.
            models.UniqueConstraint(fields=["operation_key", "seq"], name="audit_chain_seq"),
        ]
        indexes = [
            models.Index(fields=["kind", "at"], name="audit_kind_at"),
            # The audit trail filtered by kind, newest first by id: read backwards, no sort.
            models.Index(fields=["kind", "id"], name="audit_kind_id"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_key or 'system'} #{self.seq} {self.kind}"


class AuditCheckpoint(models.Model):
    """A signed statement of every chain's head as of one moment.

    ``heads`` holds the chains that moved since an earlier checkpoint (a delta); the
    union of all checkpoints is the state they vouch for. ``signature`` is an HMAC of
    ``digest`` under the audit key, which is not in the database, so rewriting history
    needs more than SQL access. Every checkpoint is also appended to a file outside the
    database.
    """

    number = models.BigIntegerField(unique=True)
    made_at = models.DateTimeField()
    rescan_from = models.BigIntegerField(help_text="Events with a higher id were scanned.")
    watermark = models.BigIntegerField(help_text="The highest event id seen.")
    heads = models.JSONField(default=dict)
    # Chains that moved but did not extend what an earlier checkpoint vouched for:
    # [{"chain", "seq", "reason"}], signed with the rest (``AuditAlarm`` shows them).
    broken = models.JSONField(default=list, blank=True)
    prev_digest = models.CharField(max_length=71)
    digest = models.CharField(max_length=71)
    signature = models.CharField(max_length=80)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"checkpoint #{self.number}"


class AuditChainHead(models.Model):
    """The head of a chain that no operation row holds: the system chain's.

    An operation keeps its chain's head in its own row; the system chain keeps its head
    here, written by the same transaction as its events, so that a cut of its newest
    events shows before any checkpoint covers them. Appending locks this row.
    """

    chain = models.CharField(max_length=200, unique=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=71)

    def __str__(self) -> str:
        return f"{self.chain or 'system'} head #{self.seq}"


class AuditVouchedHead(models.Model):
    """The newest head a checkpoint signed for one chain: where the next one extends from.

    ``signature`` (HMAC under the audit key) binds chain, seq, hash and checkpoint, so a
    row cannot be forged with SQL access alone. A checkpoint reads the rows of the
    chains that moved, never every checkpoint before it.
    """

    chain = models.CharField(max_length=200, unique=True)
    seq = models.BigIntegerField()
    hash = models.CharField(max_length=71)
    checkpoint = models.BigIntegerField(help_text="The number of the checkpoint that signed it.")
    signature = models.CharField(max_length=80)

    def __str__(self) -> str:
        return f"{self.chain or 'system'} vouched #{self.seq} by checkpoint #{self.checkpoint}"


class AuditAlarm(models.Model):
    """A chain a checkpoint refused to sign: it no longer extends what was signed before.

    Raised by the checkpoint that found it (and named in that checkpoint's signed
    ``broken`` list); ``signature`` covers what was found. A supervisor resolves it in the
    console, on the record (``audit_alarm_resolved`` on the system chain).
    """

    class Kind(models.TextChoices):
        AUDIT_BROKEN = "audit_broken", "audit log broken"
        # A signed checkpoint the checkpoint file lacks (its storage failed).
        CHECKPOINT_FILE = "checkpoint_file", "checkpoint file incomplete"

    kind = models.CharField(max_length=40, choices=Kind.choices, default=Kind.AUDIT_BROKEN)
    chain = models.CharField(max_length=200, blank=True)
    seq = models.BigIntegerField()
    reason = models.TextField()
    checkpoint = models.BigIntegerField(help_text="The checkpoint that found it.")
    raised_at = models.DateTimeField()
    signature = models.CharField(max_length=80)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = ActorField()
    resolution = models.TextField(blank=True)

    class Meta:
        ordering = ["-raised_at", "-id"]
        constraints = [
            # One open alarm per chain and kind: a chain still broken at the next
            # checkpoint is the same alarm, not a new one every minute.
            models.UniqueConstraint(
                fields=["kind", "chain"],
                condition=Q(resolved_at__isnull=True),
                name="audit_alarm_one_open_per_kind_chain",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.chain or 'system'} #{self.seq}"

    @property
    def open(self) -> bool:
        return self.resolved_at is None


class AuditVerification(models.Model):
    """The outcome of one full verification of the audit log (``verify_audit``).

    Kept so that the console can say when the log was last verified and what the first
    problem was, without verifying a million events on a page view. Only a record of a
    run: the proof is running ``verify_audit`` again.
    """

    class Scope(models.TextChoices):
        FULL = "full", "full"  # every event, every checkpoint (in one go, or a job's slices)
        INCREMENTAL = "incremental", "incremental"  # what the checkpoints since signed

    at = models.DateTimeField(help_text="When the verification started.")
    ok = models.BooleanField()
    problem = models.TextField(blank=True, help_text="The first problem found, if any.")
    events_checked = models.BigIntegerField(default=0)
    scope = models.CharField(max_length=20, choices=Scope.choices, default=Scope.FULL)
    # The newest checkpoint it covered, and where that checkpoint's line ends in the
    # checkpoint file: the next incremental verification starts after both.
    checkpoint = models.BigIntegerField(default=0)
    file_offset = models.BigIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"verification at {self.at:%Y-%m-%d %H:%M:%S}: {'ok' if self.ok else 'broken'}"


class AuditVerifyJob(models.Model):
    """A full verification of the audit log done in slices, one per run of its task.

    First the checkpoints (and the file), then the chains in their order, a bounded
    slice of events per run, each run starting after ``after_chain``; last the stored
    and vouched heads and the alarms. The outcome is an ``AuditVerification`` of scope
    ``full`` when it finishes (or at its first problem).
    """

    class Phase(models.TextChoices):
        CHECKPOINTS = "checkpoints", "checkpoints"
        CHAINS = "chains", "chains"
        FINISH = "finish", "finish"  # the stored and vouched heads, the alarms
        DONE = "done", "done"

    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.CHECKPOINTS)
    checkpoint = models.BigIntegerField(default=0, help_text="The newest checkpoint it checked.")
    file_offset = models.BigIntegerField(default=0)
    # The chains up to this one (in the events' order) are verified; null: none yet.
    after_chain = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - "" is the system chain
    events_checked = models.BigIntegerField(default=0)
    chains_checked = models.BigIntegerField(default=0)
    slices = models.IntegerField(default=0)
    verification = models.ForeignKey(
        AuditVerification, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"full verification job of {self.started_at:%Y-%m-%d %H:%M:%S}: {self.phase}"


class WebhookEvent(models.TextChoices):
    """What a webhook reports; the values are the payloads' ``type``, never renamed."""

    RELEASED = "operation.released", "Operation released"
    FAILED = "operation.failed", "Operation failed"
    VOIDED = "operation.voided", "Operation voided"
    RECONCILE = "operation.reconcile", "Operation sent to reconcile"
    RECEIPT_REPAIRED = "receipt.repaired", "Stranded receipt repaired"
    APPROVAL_DECIDED = "approval.decided", "Approval decided"


class WebhookEndpoint(models.Model):
    """A host's receiver of signed webhooks (``recovery.services.webhooks``).

    The secrets are write-only, like a provider's: shown once when made, never again.
    After a rotation the previous secret signs beside the new one until it expires.
    """

    class Status(models.TextChoices):
        ENABLED = "enabled"
        FAILING = "failing"  # still delivered to; repeated errors in a row
        DISABLED = "disabled"  # by an administrator, or by a receiver answering 410

    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="webhook_endpoints")
    url = models.CharField(max_length=500)
    # ",operation.released,operation.failed," (commas around each), or "" for every event:
    # the outbox's one INSERT … SELECT matches it with LIKE on every database.
    events = models.CharField(max_length=300, blank=True, help_text="Every event when blank.")
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ENABLED)
    failures = models.PositiveIntegerField(default=0, help_text="Failed attempts in a row.")
    disabled_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["host", "status"], name="webhook_endpoint_host")]

    def __str__(self) -> str:
        # Shown wherever an endpoint is named (admin titles, choices): never its token.
        from recovery.selectors.webhooks import webhook_url_redacted

        return f"{self.host_id}: {webhook_url_redacted(self.url)}"


class WebhookMessage(models.Model):
    """One event for one endpoint: the outbox row, written with the change it reports.

    ``msg_id`` is the ``webhook-id`` of every attempt, so receivers drop duplicates. A
    message is delivered only after every earlier one of its (endpoint, operation): one
    written behind a pending one waits (``next_attempt_at`` null) until that one is done,
    so the due index holds only the heads. A worker that claims a message holds it until
    ``lease_expires_at``; a claim whose worker died lapses there.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # given up after the retry window; an operator may redeliver

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="messages")
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="+")
    event = models.CharField(max_length=40, choices=WebhookEvent.choices)
    payload = models.TextField(help_text="The JSON body, exactly as signed and sent.")
    msg_id = models.CharField(max_length=60, unique=True)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status="pending"),
                name="webhook_message_due",
            ),
            models.Index(
                fields=["endpoint", "operation", "id"],
                condition=Q(status="pending"),
                name="webhook_message_order",
            ),
            models.Index(fields=["endpoint", "-id"], name="webhook_message_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.msg_id}"


class Pulse(models.Model):
    """When a periodic job last finished, one row per job (``name``), updated in place.

    Written once per run, not per operation, so that "is beat still sweeping?" is one
    indexed read. ``seconds`` is how long that run took.
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


class ProviderLookups(models.Model):
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
