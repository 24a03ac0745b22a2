"""What the client concludes, as typed exceptions: ``Host.run``'s outcomes that are not
an effect, and a server it could not reach or understand.

The approval was denied or expired, nobody decided in time, an operator must decide, or
Settle could not be reached (``TransportError``) or answered outside the API document
(``ProtocolError``).
"""

from __future__ import annotations

from typing import Any

from settle_client.errors.api import SettleError


class TransportError(SettleError):
    """Settle could not be reached, or its answer was lost (after the retries allowed)."""

    code = "transport"


class ProtocolError(SettleError):
    """An answer that is not what the API document promises."""

    code = "protocol"


class OperationClosed(SettleError):
    """The operation ended without its effect: ``state`` says how."""

    code = "closed"

    def __init__(self, message: str, *, key: str, state: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.key = key
        self.state = state


class ApprovalDenied(OperationClosed):
    """The approver denied the exact action."""

    code = "approval_denied"


class ApprovalExpired(OperationClosed):
    """Nobody decided before the approval expired, or the permit expired unused."""

    code = "approval_expired"


class OperationRevoked(OperationClosed):
    """The permit was revoked before it was spent."""

    code = "operation_revoked"


class OperationVoided(OperationClosed):
    """An operator voided the operation."""

    code = "operation_voided"


class ApprovalTimeout(SettleError):
    """The approval is still pending after the wait ``run`` was allowed; ask again later.

    ``rule`` and ``needed``: the policy rule that asked for people, and what it needed
    when the approval opened ("0 of 2 approvals"); empty without a rule.
    """

    code = "approval_timeout"

    def __init__(
        self,
        message: str,
        *,
        key: str,
        approval_id: str,
        rule: str = "",
        needed: str = "",
        **details: Any,
    ) -> None:
        super().__init__(message, **details)
        self.key = key
        self.approval_id = approval_id
        self.rule = rule
        self.needed = needed


class NeedsOperator(SettleError):
    """Settle cannot settle this by itself: an operator decides (``state``, ``reason``).

    ``reason`` is ``reconcile`` (evidence contradicts or is missing after the lookup
    budget) or ``unknown`` (still unknown when ``run`` stopped waiting). The effect is
    never run again for this key.
    """

    code = "needs_operator"

    def __init__(self, message: str, *, key: str, state: str, reason: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.key = key
        self.state = state
        self.reason = reason
