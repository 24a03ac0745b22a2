"""Registering an operation: the intended effect, persisted before anything is dispatched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError

from audit.chain import audit_append, audit_head_new, audit_head_write, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.canonical import canonical_params, params_digest
from common.errors import ErrorCode
from dbsql.rows import model_unsaved
from dbsql.writes import insert_naming
from policies.services import budgets_paid_last
from recovery.models import Host, Operation, State
from recovery.services.errors import NotFound, RecoveryError


def operation_register(
    *,
    host: Host,
    key: str,
    action: str,
    provider_name: str,
    params: Any,
    then: Callable[[Operation], object] | None = None,
) -> tuple[Operation, bool]:
    """Persist the intended effect before anything is dispatched; idempotent per key.

    The same registration again returns the existing operation; the same key with any
    difference (host, action, provider or params) is a ``key_conflict``.

    ``then``: called with the operation this call made, before its transaction ends,
    the row locked by that transaction (no other can see it yet) and its chain with it
    (``permits.approval_open_locked``: the approval opened in the same transaction).
    What it raises rolls the registration back with it. Not called for an operation
    found; called again, afresh, where the transaction runs again (a budget that
    could not pay last, ``policies.budgets_paid_last``).
    """
    canonical = canonical_params(params)
    digest = params_digest(canonical)

    def made() -> tuple[Operation, bool]:
        with audit_transaction():
            operation = model_unsaved(
                Operation,
                key=key,
                host=host,
                action=action,
                params_canonical=canonical,
                params_digest=digest,
                state=State.AWAITING_APPROVAL,
            )
            audit_head_new(operation)
            audit_append(
                kind=AuditKind.REGISTERED,
                operation=operation,
                actor=Actor.of("host", host),
                data={"action": action, "provider": provider_name, "params_digest": digest},
            )
            # The chain's head goes into the row with it, the provider found by the same
            # statement: one INSERT, event aside.
            audit_head_write(operation)
            if insert_naming(operation, "provider", name=provider_name) is None:
                raise NotFound(ErrorCode.UNKNOWN_PROVIDER, f"no provider named {provider_name!r}")
            if then is not None:
                then(operation)
            return operation, True

    try:
        # An approval opened by ``then`` pays its budget last (``policies``).
        return budgets_paid_last(made)
    except IntegrityError:
        existing = Operation.objects.select_related("provider").filter(key=key).first()
        if existing is None:
            raise
    same = (
        existing.host_id == host.pk
        and existing.action == action
        and existing.provider.name == provider_name
        and existing.params_digest == digest
    )
    if not same:
        raise RecoveryError(
            ErrorCode.KEY_CONFLICT, f"operation {key!r} exists with a different action"
        )
    return existing, False
