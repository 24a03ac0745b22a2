"""Refusals on the audit log: one recorder, one shape.

Every refusal event (an operator's action, a decision, a permit's consumption, a passkey
signature, a bulk decision, a sign-in, a held session) carries the refusal's code as
``code``, beside what it was about. Events already on the chain keep the shape they were
hashed with: a permit's consumption and a decision refused said ``reason`` for the code,
and a refused signature ``reason`` for its message; ``refusal_code`` and
``refusal_message`` read both.
"""

from __future__ import annotations

from typing import Any

from audit.chain import audit_append
from audit.kinds import AuditKind
from audit.models import AuditEvent, ChainHolder
from common.actors import Actor

REFUSAL_KINDS = frozenset(
    {
        AuditKind.OPERATOR_REFUSED,
        AuditKind.DECISION_REFUSED,
        AuditKind.CONSUME_REFUSED,
        AuditKind.SIGNATURE_REFUSED,
        AuditKind.BULK_REFUSED,
        AuditKind.SIGN_IN_REFUSED,
        AuditKind.PASSKEY_HOLD_REFUSED,
    }
)
# The kinds whose events said ``reason`` for the code before there was one shape.
_CODE_AS_REASON = frozenset({AuditKind.CONSUME_REFUSED, AuditKind.DECISION_REFUSED})


def refusal_append(
    *,
    kind: AuditKind,
    code: str,
    actor: Actor | None,
    operation: ChainHolder | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Put a refusal on the chain (``audit_append``, in the caller's audit transaction):
    ``code`` (an ``ErrorCode`` or a refusal's own code) and what it was about (``data``)."""
    assert kind in REFUSAL_KINDS, kind
    assert "reason" not in (data or {}), "the refusal's code is its code: say it once"
    return audit_append(
        kind=kind, operation=operation, actor=actor, data={"code": str(code), **(data or {})}
    )


def refusal_code(kind: str, data: dict[str, Any]) -> str:
    """The code of a refusal event, written in either shape."""
    if "code" in data:
        return str(data["code"])
    if kind in _CODE_AS_REASON:
        return str(data.get("reason", ""))
    return ""


def refusal_message(kind: str, data: dict[str, Any]) -> str:
    """What a refused signature's event says of why, in either shape."""
    if "message" in data:
        return str(data["message"])
    return "" if kind in _CODE_AS_REASON else str(data.get("reason", ""))
