"""Refusals stay on the record: ``RefusalsCommitted`` commits what was recorded, then
lets the refusal go on; anything else rolls back."""

from __future__ import annotations

import pytest

from audit.chain import audit_append
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.errors import ErrorCode
from recovery.models import Operation
from recovery.services.errors import RecoveryError
from recovery.services.locking import operation_lock
from recovery.services.refusals import RefusalsCommitted

pytestmark = pytest.mark.django_db(transaction=True)


def _kinds(key: str) -> list[str]:
    return list(AuditEvent.objects.filter(operation_key=key).values_list("kind", flat=True))


def test_a_refusal_is_raised_after_what_it_recorded_committed(flow):
    flow.register("op-1")
    seen: list[tuple[str, list[str]]] = []

    def then(error: RecoveryError) -> None:
        seen.append((error.code, _kinds("op-1")))

    with (
        pytest.raises(RecoveryError, match="no, and on the record"),
        RefusalsCommitted(then=then),
    ):
        locked = operation_lock(Operation.objects.get(key="op-1"))
        audit_append(kind=AuditKind.DECISION_REFUSED, operation=locked, actor=Actor.system("t"))
        raise RecoveryError(ErrorCode.NOT_ALLOWED, "no, and on the record")
    assert _kinds("op-1") == ["registered", "decision_refused"]
    # ``then`` ran once the record was committed, before the refusal went on.
    assert seen == [("not_allowed", ["registered", "decision_refused"])]


def test_any_other_error_rolls_everything_back(flow):
    flow.register("op-1")
    called: list[RecoveryError] = []
    with pytest.raises(ZeroDivisionError), RefusalsCommitted(then=called.append):
        locked = operation_lock(Operation.objects.get(key="op-1"))
        audit_append(kind=AuditKind.DECISION_REFUSED, operation=locked, actor=Actor.system("t"))
        1 / 0  # noqa: B018
    assert _kinds("op-1") == ["registered"]
    assert called == []
