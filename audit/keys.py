"""Signing under the audit key: what only the key's holder can make.

The key (``SETTLE_AUDIT_KEY``) is not in the database, so someone with SQL access alone
can neither forge a checkpoint, a vouched head or an alarm, nor re-sign one they changed.
"""

from __future__ import annotations

import hmac

from django.conf import settings


def sign(digest: str) -> str:
    """The HMAC of ``digest`` under the audit key: what only the key's holder can make."""
    key = str(settings.SETTLE_AUDIT_KEY).encode("utf-8")
    return "hmac-sha256:" + hmac.digest(key, digest.encode("ascii"), "sha256").hex()


def signed_by_key(digest: str, signature: str) -> bool:
    return hmac.compare_digest(sign(digest), signature)
