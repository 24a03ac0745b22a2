"""Notices to hosts: their endpoints, and the outbox of messages each is sent."""

from __future__ import annotations

import urllib.parse

from django.db import models
from django.db.models import Q

from recovery.models import Host, Operation


def webhook_url_redacted(url: str) -> str:
    """``url``'s scheme, host and port; what follows, if anything, shown as ``/…``."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    rest = "/…" if parts.path not in ("", "/") or parts.query or parts.fragment else "/"
    return f"{parts.scheme}://{host}{rest}"


class WebhookEvent(models.TextChoices):
    """What a webhook reports; the values are the payloads' ``type``, never renamed."""

    RELEASED = "operation.released", "Operation released"
    FAILED = "operation.failed", "Operation failed"
    VOIDED = "operation.voided", "Operation voided"
    RECONCILE = "operation.reconcile", "Operation sent to reconcile"
    RECEIPT_REPAIRED = "receipt.repaired", "Stranded receipt repaired"
    APPROVAL_DECIDED = "approval.decided", "Approval decided"
    APPROVAL_OPENED = "approval.opened", "Approval opened for the customer"


class WebhookEndpoint(models.Model):
    """A host's receiver of signed webhooks (``webhooks.endpoints``).

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
