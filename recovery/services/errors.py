"""What a refused call raises: a stable ``code`` that the HTTP layer maps to a status."""

from __future__ import annotations

from typing import Any


class RecoveryError(Exception):
    """A refused request; ``code`` is the stable error code the API returns."""

    status = 409

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class NotFound(RecoveryError):
    status = 404


class Invalid(RecoveryError):
    status = 422
