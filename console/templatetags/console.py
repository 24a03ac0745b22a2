"""Template filters of the console: relative ages and why an operation waits."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString

from recovery.selectors import QUEUE_COUNT_CAP, QUEUE_REASONS

register = template.Library()

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def relative(seconds: float) -> str:
    """``3 min ago`` / ``in 2 h``: the largest whole unit, rounded down."""
    whole = int(abs(seconds))
    if whole < 5:
        return "just now"
    amount, unit = next((whole // size, name) for name, size in _UNITS if whole >= size)
    return f"{amount} {unit} ago" if seconds >= 0 else f"in {amount} {unit}"


@register.filter
def age(value: datetime | str | None) -> SafeString | str:
    """A relative age, with the exact UTC time on hover (and for machines).

    Takes an ISO 8601 string too: the selectors' records carry their times as such.
    """
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None:
        return "—"
    exact = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        exact.isoformat(timespec="seconds").replace("+00:00", "Z"),
        exact.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative((timezone.now() - value).total_seconds()),
    )


@register.filter
def queue_reason(operation: Any) -> str:
    """Why an operation waits: the reason the queue's selector annotated, in words."""
    code = getattr(operation, "reason", None) or ""
    return QUEUE_REASONS.get(code) or code.replace("_", " ").capitalize() or "—"


@register.filter
def queue_count(value: int) -> str:
    """A queue count as the selector capped it: "1,000+" once past the cap."""
    if value > QUEUE_COUNT_CAP:
        return f"{QUEUE_COUNT_CAP:,}+"
    return str(value)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def duration(value: timedelta | None) -> str:
    """``15 min``: a length of time in its largest whole unit."""
    if value is None:
        return "a while"
    whole = int(value.total_seconds())
    return next((f"{whole // size} {name}" for name, size in _UNITS if whole >= size), "0 s")


@register.filter
def compact_json(value: Any) -> str:
    """One line of JSON, keys sorted: an audit event's data in a table cell."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
