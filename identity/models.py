"""What Settle keeps of its people beyond allauth's rows.

allauth keeps each passkey (``Authenticator``) but not how often it has signed: the
sign count an authenticator reports with each assertion, which only grows on a passkey
that was never copied. ``PasskeyUse`` keeps the last one seen for each credential.
"""

from __future__ import annotations

from django.db import models


class PasskeyUse(models.Model):
    """The last sign count a passkey reported with a signed decision, and when."""

    # base64url, as the audit log's passkey events name it.
    credential_id = models.CharField(max_length=1400, unique=True)
    sign_count = models.BigIntegerField(default=0)
    last_used_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"passkey {self.credential_id[:12]}… signed {self.sign_count}"
