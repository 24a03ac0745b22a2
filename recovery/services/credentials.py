"""Credentials: hosts' and approvers' bearer tokens — created, disabled, rotated, audited.

A token is shown once and stored hashed. Disabling and rotating take effect within
``SETTLE_CREDENTIAL_CACHE_SECONDS`` (``recovery.services.token_cache``), and credentials
are kept, never deleted: operations, decisions and the audit log refer to them.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from approvals.models import Approver
from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.credentials import token_new
from common.errors import ErrorCode
from recovery.models import Host
from recovery.services import token_cache
from recovery.services.errors import NotFound

KINDS: dict[str, type[models.Model]] = {"host": Host, "approver": Approver}


def host_create(*, name: str, display_name: str = "") -> tuple[Host, str]:
    """Create a host credential; the token is shown once and stored hashed.

    ``display_name``: who asks, as the host's customers know it (blank: ``name``)."""
    token, hashed = token_new("host")
    host = Host.objects.create(name=name, display_name=display_name, token_hash=hashed)
    return host, token


def _credential(kind: str, name: str) -> models.Model:
    if kind not in KINDS:
        raise NotFound(ErrorCode.UNKNOWN_CREDENTIAL_KIND, f"a credential is one of {sorted(KINDS)}")
    model = KINDS[kind]
    credential = model.objects.select_for_update().filter(name=name).first()  # type: ignore[attr-defined]
    if credential is None:
        raise NotFound(ErrorCode.UNKNOWN_CREDENTIAL, f"no {kind} named {name!r}")
    return credential  # type: ignore[no-any-return]


@audit_transaction()
def credential_disable(*, kind: str, name: str, actor: Actor, disabled: bool = True) -> None:
    """Disable (or enable again) a host or approver credential; audited."""
    credential = _credential(kind, name)
    token_cache.credential_forget(token_hash=credential.token_hash)  # type: ignore[attr-defined]
    credential.disabled_at = timezone.now() if disabled else None  # type: ignore[attr-defined]
    credential.save(update_fields=["disabled_at"])
    audit_append(
        kind=AuditKind.CREDENTIAL_DISABLED if disabled else AuditKind.CREDENTIAL_ENABLED,
        actor=actor,
        data={"credential": kind, "id": credential.pk, "name": name},
    )


@audit_transaction()
def credential_rotate(*, kind: str, name: str, actor: Actor) -> str:
    """Give a credential a new token; the old one answers 401 from now on. Audited."""
    credential = _credential(kind, name)
    token_cache.credential_forget(token_hash=credential.token_hash)  # type: ignore[attr-defined]
    token, hashed = token_new(kind)
    credential.token_hash = hashed  # type: ignore[attr-defined]
    credential.save(update_fields=["token_hash"])
    audit_append(
        kind=AuditKind.CREDENTIAL_ROTATED,
        actor=actor,
        data={"credential": kind, "id": credential.pk, "name": name},
    )
    return token
