"""What a refused call raises: ``common.errors.SettleError``, under the names callers use."""

from __future__ import annotations

from typing import Any

from common.errors import ErrorCode, SettleError


class RecoveryError(SettleError):
    """A refused request; ``code`` (an ``ErrorCode``) is the stable code the API returns."""


class NotFound(RecoveryError):
    """What was named does not exist, or not for this caller."""


class Invalid(RecoveryError):
    """Settings or values no call may carry."""


class Forbidden(RecoveryError):
    """The caller may see what was named but may not do this to it (code ``forbidden``)."""

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(ErrorCode.FORBIDDEN, message, **extra)
