"""Crash-safe actions for hosts of Settle.

    host = settle_client.Host("https://settle.example", token)
    outcome = host.run("pay-42", action="payment.send", provider="payments",
                       params={"amount": 1250, "currency": "EUR"}, effect=send)

``run`` registers, waits for the approval, dispatches once, runs ``effect`` with a
heartbeat, reports, and after a crash settles the same key without running it again.
"""

from __future__ import annotations

from settle_client import errors
from settle_client._protocol import Outcome
from settle_client.approver import Approval, Approver, AsyncApprover, Decided
from settle_client.async_host import AsyncAttempt, AsyncHost
from settle_client.canonical import CanonicalError, canonical_params, params_digest
from settle_client.errors import (
    ApiError,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalTimeout,
    NeedsOperator,
    OperationClosed,
    OperationRevoked,
    OperationVoided,
    ProtocolError,
    SettleError,
    TransportError,
)
from settle_client.host import Attempt, Host
from settle_client.provider import Callbacks, signature, signed

__all__ = [
    "ApiError",
    "Approval",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalTimeout",
    "Approver",
    "AsyncApprover",
    "AsyncAttempt",
    "AsyncHost",
    "Attempt",
    "Callbacks",
    "CanonicalError",
    "Decided",
    "Host",
    "NeedsOperator",
    "OperationClosed",
    "OperationRevoked",
    "OperationVoided",
    "Outcome",
    "ProtocolError",
    "SettleError",
    "TransportError",
    "canonical_params",
    "errors",
    "params_digest",
    "signature",
    "signed",
]
