"""Finding and locking the operation a call is about, in the one lock order.

Lock order, the same everywhere, so that no two calls can wait on each other in a
cycle:

1. the operation row (``operation_lock``: ``FOR NO KEY UPDATE OF`` the operation only,
   never its provider or host, and the operation's audit chain with it);
2. then the approvals rows bound to that operation (approval, permit);
3. then its dispatch (which holds the host's receipt).

The sweeper (``sweep``) locks a batch of operation rows in one statement with ``SKIP
LOCKED`` — it never waits for a row someone holds — and then, under each, only that
operation's lookup attempts; so it cannot join a cycle either. A batch of background
lookups (``lookup_batch_run``) locks its operations in one statement, in id order, then
their attempts; two batches over the same rows take them in the same order. A chunk of a
bulk batch (``bulk.services``) locks its own items first (rows nothing else
locks, ``SKIP LOCKED``), then their operations in id order, as one operator action or
``operations_reconcile_many`` does.

Nothing else is locked: rows of other operations are never touched, the audit log has
no global head (an operation's chain is guarded by the operation's lock; the system
chain by an advisory lock), and no lock is held across a network call — lookups read
the provider outside any transaction and apply the answer under the lock afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet, Subquery

from approvals.models import Approval, Approver, Permit
from approvals.services.approvals import Binding
from audit.chain import audit_chain_locked
from common.errors import ErrorCode
from dbsql import columns
from dbsql.rows import select_locked_with
from recovery.models import (
    Host,
    Operation,
)
from recovery.selectors.access import operations_for_approver, operations_for_host
from recovery.services.errors import NotFound


@dataclass(frozen=True)
class OperationRef:
    """An operation named by its key among one host's operations, not read yet.

    The host API passes these, so that finding the operation and locking it are one
    statement; ``NotFound`` when the host has no such operation.
    """

    key: str
    host: Host


def locking(operations: QuerySet[Operation]) -> QuerySet[Operation]:
    """``operations`` as they are read for writing: locked, with their provider.

    ``of=("self",)`` locks the operation row only, never its provider or host;
    ``no_key`` lets concurrent inserts that reference the operation (dispatch,
    evidence) check their foreign key freely.
    """
    return operations.select_for_update(of=("self",), no_key=True).select_related("provider")


def operations_locked() -> QuerySet[Operation]:
    return locking(Operation.objects.all())


def operations_locked_by_id(ids: Any) -> dict[int, Operation]:
    """Lock the operations ``ids`` names (a list or a subquery), in id order, their chains
    with them; by id. The order every batch takes them in."""
    operations = locking(Operation.objects.filter(pk__in=ids)).order_by("pk")
    return {operation.pk: audit_chain_locked(operation) for operation in operations}


def operation_lock_bound(
    record: type[Approval] | type[Permit],
    pk: Any,
    *,
    missing: ErrorCode,
    host: Host | None = None,
    approver: Approver | None = None,
) -> Operation:
    """Lock the operation an approval or permit binds to, in one statement.

    Only among this host's operations, or within this approver's scope; otherwise the
    record does not exist for the caller (``NotFound(missing)``). A host's operations
    and an approver's unrestricted scope go through the written-out lock (``_row_locked``);
    a restricted scope is the ORM's filter, ``Approver.scope``.
    """
    scope = approver.scope(provider="provider__name", host="host__name") if approver else Q()
    if host is not None or not scope:
        table, column = record._meta.db_table, record._meta.pk.column
        bound = f't."key" = (SELECT b."operation_key" FROM {table} b WHERE b."{column}" = %s)'
        operation = _row_locked(bound, [columns.prep(record, "pk", pk)], host)
    else:
        bound_key = record.objects.filter(pk=pk).values("operation_key")[:1]
        assert approver is not None
        scoped = operations_for_approver(approver=approver)
        operation = locking(scoped.filter(key=Subquery(bound_key))).first()
    if operation is None:
        raise NotFound(missing, f"no such {record.__name__.lower()}")
    return audit_chain_locked(operation)


def _meant(operation: Operation | OperationRef) -> QuerySet[Operation]:
    """The one operation meant: by its key among its host's operations, or by its pk."""
    if isinstance(operation, OperationRef):
        return operations_for_host(host=operation.host).filter(key=operation.key)
    return Operation.objects.filter(pk=operation.pk)


def _found(operations: QuerySet[Operation], operation: Operation | OperationRef) -> Operation:
    found = operations.first()
    if found is None:
        raise NotFound(ErrorCode.UNKNOWN_OPERATION, f"no operation {operation.key!r} for this host")
    return found


def operation_lock(operation: Operation | OperationRef) -> Operation:
    """Lock ``operation`` (first in the lock order) and read it afresh; its chain with it."""
    if isinstance(operation, OperationRef):
        found = _row_locked("t.key = %s", [operation.key], operation.host)
    else:
        found = _row_locked("t.id = %s", [operation.pk])
    if found is None:
        raise NotFound(ErrorCode.UNKNOWN_OPERATION, f"no operation {operation.key!r} for this host")
    return audit_chain_locked(found)


def _row_locked(where: str, params: list[Any], host: Host | None = None) -> Operation | None:
    """The one operation ``where`` names (``t``), with its provider, locked: one statement.

    Only among ``host``'s operations when one is given (the row's own condition: its
    host is then known, not read). What ``locking`` builds through the ORM, written out
    (``select_locked_with``): it is every host-API call's first statement, and building
    it took several times what running it takes.
    """
    if host is not None:
        where, params = f"t.host_id = %s AND {where}", [host.pk, *params]
    found = select_locked_with(Operation, "provider", where=where, params=params)
    if found is not None and host is not None:
        found._state.fields_cache["host"] = host
    return found


def operation_read(operation: Operation | OperationRef) -> Operation:
    """The operation as it is now, without a lock."""
    return _found(_meant(operation).select_related("provider"), operation)


def operation_state(operation: Operation | OperationRef) -> str:
    """Its state as it is now: one column, without a lock."""
    state = _meant(operation).values_list("state", flat=True).first()
    return str(state) if state is not None else ""


def binding(operation: Operation) -> Binding:
    return Binding(
        operation_key=operation.key,
        action=operation.action,
        provider=operation.provider.name,
        params_digest=operation.params_digest,
    )
