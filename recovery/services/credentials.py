"""Host credentials: bearer tokens shown once and stored hashed."""

from __future__ import annotations

import secrets

from approvals import services as approvals
from recovery.models import (
    Host,
)


def host_create(*, name: str) -> tuple[Host, str]:
    """Create a host credential; the token is shown once and stored hashed."""
    token = "sth_" + secrets.token_urlsafe(32)
    host = Host.objects.create(name=name, token_hash=approvals.token_hash(token))
    return host, token


def host_authenticate(*, token: str) -> Host | None:
    return Host.objects.filter(token_hash=approvals.token_hash(token)).first()
