"""The host API's query parameters, each checked in one place (400 with its code if bad):
a history page's ``after`` and ``limit``, and a read's ``wait``."""

from __future__ import annotations

from django.http import HttpRequest

from common.errors import ErrorCode
from recovery import contract
from recovery.contract import ApiError


def _whole(text: str, digits: int) -> bool:
    """Decimal digits as a number is written: no sign, no leading zero, no other script."""
    return text.isascii() and text.isdigit() and len(text) <= digits and text == str(int(text))


def page(request: HttpRequest) -> tuple[int | None, int]:
    """The ``after`` cursor and ``limit`` of a history page."""
    after = request.GET.get("after")
    if after is not None and not (after.isascii() and after.isdigit() and len(after) <= 18):
        raise ApiError(ErrorCode.INVALID_CURSOR, "after: use the cursor of a next link")
    limit = request.GET.get("limit", str(contract.HISTORY_PAGE))
    maximum = contract.HISTORY_PAGE_MAX
    if not (limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= maximum):
        raise ApiError(ErrorCode.INVALID_PAGE_SIZE, f"limit: a whole number from 1 to {maximum}")
    return (int(after) if after is not None else None), int(limit)


def wait(request: HttpRequest) -> int:
    """``wait``: whole seconds, 1 to ``OPERATION_WAIT_MAX``; 0 when not asked."""
    seconds = request.GET.get("wait")
    if seconds is None:
        return 0
    maximum = contract.OPERATION_WAIT_MAX
    if not (_whole(seconds, 2) and 1 <= int(seconds) <= maximum):
        raise ApiError(ErrorCode.INVALID_WAIT, f"wait: a whole number of seconds, 1 to {maximum}")
    return int(seconds)
