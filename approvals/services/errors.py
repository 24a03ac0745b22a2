"""What approvals and permits refuse with: each refusal carries its code (``common.errors``)."""

from __future__ import annotations

from common.errors import ErrorCode, SettleError


class Refusal:
    """Why a permit was not consumed: the codes a dispatch refusal answers with."""

    NOT_AUTHORIZED = ErrorCode.NOT_AUTHORIZED
    ACTION_MISMATCH = ErrorCode.ACTION_MISMATCH
    EXPIRED = ErrorCode.EXPIRED
    REVOKED = ErrorCode.REVOKED
    ALREADY_CONSUMED = ErrorCode.ALREADY_CONSUMED


class ApprovalError(SettleError):
    """A refused approval or approver; recovery re-raises it with the permit's status."""
