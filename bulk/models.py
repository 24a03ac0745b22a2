"""Bulk work: one action on a frozen selection of operations, and each operation's outcome."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from common.actors import ActorField
from recovery.models import Leased, Operation


class BulkBatch(Leased, models.Model):
    """One bulk action on a frozen selection of operations (``bulk.services``).

    The selection is frozen when it is submitted, as one ``BulkItem`` per operation with
    the version it had then; later arrivals are never swept in. A lookup or confirm batch
    runs at once; a void batch waits as one proposal until a second person approves or
    rejects it as a whole. While it runs, its lease says a worker made progress lately:
    one that lapses with items still pending is resumed by beat (``bulk_resume``).
    """

    class Action(models.TextChoices):
        LOOKUP = "lookup", "Look up now"
        CONFIRM = "confirm", "Confirm"
        VOID = "void", "Void"

    class Status(models.TextChoices):
        PROPOSED = "proposed"  # a void waiting for a second person
        RUNNING = "running"
        FINISHED = "finished"
        REJECTED = "rejected"

    id = models.UUIDField(primary_key=True)
    action = models.CharField(max_length=10, choices=Action.choices)
    status = models.CharField(max_length=10, choices=Status.choices)
    reason = models.CharField(max_length=500)
    # How the operations were chosen: the queue's filter as a query string, or "by hand".
    selection = models.CharField(max_length=500, blank=True)
    proposed_by = ActorField(blank=False)
    created_at = models.DateTimeField()
    decided_by = ActorField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=500, blank=True)
    # The decider's passkey signature of the decision (``common.webauthn``'s record),
    # also in its audit event; empty when it was not signed.
    signature = models.JSONField(default=dict, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField()
    total = models.PositiveIntegerField()
    # Written when the batch finishes; while it runs, counted from its items.
    done_count = models.PositiveIntegerField(default=0)
    refused_count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "console_bulkbatch"  # made by the console app, before bulk was an app
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="running"),
                name="bulk_batch_running",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["proposed", "running"]) | Q(finished_at__isnull=False),
                name="bulk_batch_over_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} batch {self.pk} ({self.status})"

    @property
    def short_id(self) -> str:
        return str(self.pk)[:8]


class BulkItem(models.Model):
    """One operation of a batch, with the version frozen at submission and its outcome.

    The outcome is written in the transaction of the change it made, with the item row
    locked: an item is done once, and a worker killed between two items loses nothing.
    ``operation`` is empty when the id submitted names no operation at all.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        REFUSED = "refused"

    batch = models.ForeignKey(BulkBatch, on_delete=models.PROTECT, related_name="items")
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The id as submitted: the operation's, or a forged one that names none.
    operation_ref = models.BigIntegerField()
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    code = models.CharField(max_length=40, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "console_bulkitem"
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "operation_ref"], name="bulk_item_once"),
        ]
        indexes = [models.Index(fields=["batch", "status"], name="bulk_item_status")]

    def __str__(self) -> str:
        return f"item {self.operation_ref} of {self.batch_id} ({self.status})"
