"""Refusals stay on the record: a service's refusal is written, committed, then raised.

``refusals_recorded`` wraps a service whose transition may be refused because the
operation moved on; ``RefusalsCommitted`` is the transaction that commits what a refusal
recorded before the refusal goes on to the caller.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import wraps
from types import TracebackType
from typing import Any, NoReturn, TypeVar, cast

from audit.chain import audit_append, audit_chain_locked, audit_transaction
from audit.kinds import AuditKind
from audit.refusals import refusal_append
from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Operation
from recovery.services.errors import RecoveryError
from recovery.services.locking import operations_locked
from recovery.transitions import TransitionRefused
from recovery.vocabulary import StaleSignal

F = TypeVar("F", bound=Callable[..., Any])


def refusals_recorded(
    actor: str | Callable[[dict[str, Any]], Actor] = "actor",
) -> Callable[[F], F]:
    """A service whose transition was refused records it and raises ``stale_state``.

    The operation moved on while the call was in flight: its transaction rolled back,
    so the refusal is recorded in one of its own, and the caller — the API, a task, a
    console view — gets a ``RecoveryError`` like any other refusal. ``actor``: the name
    of the keyword argument that says who called, or how to tell from the arguments.
    """

    def decorate(function: F) -> F:
        @wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except TransitionRefused as exc:
                who = actor(kwargs) if callable(actor) else kwargs.get(actor)
                _transition_refused_record(exc, who)
                raise RecoveryError(
                    ErrorCode.STALE_STATE, f"the operation moved on ({exc.state})", state=exc.state
                ) from exc

        return cast(F, inner)

    return decorate


class RefusalsCommitted:
    """An ``audit_transaction`` that commits what was recorded before a refusal, then lets
    the refusal (a ``RecoveryError``) go on to the caller.

    A refusal must stay on the record, and raising inside the transaction would roll
    the record back with everything else. ``then``, if given, runs after that commit and
    before the refusal goes on (to record it in a transaction of its own, say). Any other
    exception rolls back as usual.
    """

    def __init__(self, then: Callable[[RecoveryError], None] | None = None) -> None:
        self._transaction = audit_transaction()
        self._then = then

    def __enter__(self) -> None:
        self._transaction.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not isinstance(exc, RecoveryError):
            self._transaction.__exit__(exc_type, exc, tb)
            return
        self._transaction.__exit__(None, None, None)
        if self._then is not None:
            self._then(exc)


def _transition_refused_record(exc: TransitionRefused, actor: Actor | None) -> None:
    """Record a refused transition in a transaction of its own (the change rolled back)."""
    with audit_transaction():
        operation = operations_locked().filter(key=exc.operation_key).first()
        if operation is not None:
            audit_chain_locked(operation)
        audit_append(
            kind=AuditKind.STALE_SIGNAL,
            operation=operation,
            actor=actor,
            data={
                "signal": StaleSignal.TRANSITION_REFUSED,
                "event": exc.event,
                "reason": exc.reason,
                "state": exc.state,
                "version": exc.version,
            },
        )


class DecisionRefusal:
    """Record a refused decision on the operation's chain, then raise it (committed by
    ``RefusalsCommitted``)."""

    def __init__(self, operation: Operation, approval_id: uuid.UUID, actor: Actor) -> None:
        self.operation, self.approval_id, self.actor = operation, approval_id, actor

    def __call__(
        self, code: ErrorCode, message: str, data: dict[str, Any], **detail: Any
    ) -> NoReturn:
        refusal_append(
            kind=AuditKind.DECISION_REFUSED,
            code=code,
            operation=self.operation,
            actor=self.actor,
            data={"approval_id": str(self.approval_id), **data},
        )
        raise RecoveryError(code, message, **detail)
