"""An operator's export of the audit trail, written to a file by a worker."""

from __future__ import annotations

from django.db import models


class AuditExport(models.Model):
    """One export of the audit trail, written to a file by a worker (``audit_export_run``).

    A web request only asks for it and later hands out the file, so that no proxy or
    gunicorn timeout can cut a long export short after its 200. The file ends with a
    trailer line (the rows written and the SHA-256 of every byte before it): a file
    without a matching trailer is cut, whoever cut it.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True)
    requested_by = models.ForeignKey(
        "auth.User", on_delete=models.CASCADE, related_name="audit_exports"
    )
    export_format = models.CharField(max_length=5)
    # The trail's filters (``AuditFilters``' fields, times in ISO 8601), and the
    # providers whose events it may hold: who downloads it must still view each of them.
    filters = models.JSONField(default=dict)
    providers = models.JSONField(default=list)
    # Whether it may hold the system chain (its requester supervised): so must its reader.
    system_chain = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    rows = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"audit export {self.pk} ({self.export_format}, {self.status})"
