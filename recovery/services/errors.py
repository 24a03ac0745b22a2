"""What a refused call raises: a stable ``code`` that the HTTP layer maps to a status."""

from __future__ import annotations

from typing import Any


class RecoveryError(Exception):
    """A refused request; ``code`` is the stable error code the API returns.

    A Celery task or a console view raises and handles the same error; only the HTTP
    layer turns a code into a status (``recovery.api.STATUS_BY_CODE``).
    """

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class NotFound(RecoveryError):
    """What was named does not exist, or not for this caller."""


class Invalid(RecoveryError):
    """Settings or values no call may carry."""


class Forbidden(RecoveryError):
    """The caller may see what was named but may not do this to it (code ``forbidden``)."""

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__("forbidden", message, **extra)
