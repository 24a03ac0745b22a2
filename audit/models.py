"""The audit log's records: events, the chains' heads, signed checkpoints, alarms, verifications.

Everything here is append-only or signed: see ``audit.chain`` for how events are chained
and ``audit.checkpoints`` for what a checkpoint vouches for.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from common.actors import ActorField


class ChainHolder(models.Model):
    """A row that keeps the head of its own audit chain (``SETTLE_AUDIT_CHAIN_MODEL``).

    The head is read with the row lock the audited change holds anyway and written with
    that change, so that appending needs no lock of its own. Checkpoints, not these
    fields, vouch for the head.
    """

    # The chain's name: the holder's unique key (an operation's key).
    key: str
    audit_seq = models.BigIntegerField(default=0)
    audit_hash = models.CharField(max_length=71, blank=True)

    class Meta:
        abstract = True


class AuditEvent(models.Model):
    """Append-only, hash-chained record of everything that happened.

    Each operation has a chain of its own (``operation_key``; ``""`` is the chain of
    events that belong to no operation): ``seq`` counts from 1 within the chain and
    ``hash`` = sha256(prev_hash + canonical JSON of the event's content). ``id`` orders
    events across chains. See ``audit``.
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
