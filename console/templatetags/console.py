"""Template filters of the console: relative ages, why an operation waits, the queue's rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from html import escape
from typing import Any
from urllib.parse import quote

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import RFC3986_SUBDELIMS
from django.utils.safestring import SafeString, mark_safe

from recovery.selectors.queue import QUEUE_COUNT_CAP, QUEUE_REASONS, QueueRow

register = template.Library()

_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def relative(seconds: float) -> str:
    """``3 min ago`` / ``in 2 h``: the largest whole unit, rounded down."""
    whole = int(abs(seconds))
    if whole < 5:
        return "just now"
    amount, unit = next((whole // size, name) for name, size in _UNITS if whole >= size)
    return f"{amount} {unit} ago" if seconds >= 0 else f"in {amount} {unit}"


def _time_element(value: datetime, now: datetime) -> str:
    """``<time>`` with a relative age, the exact UTC time on hover (and for machines).

    Digits and fixed words only: nothing in it needs escaping.
    """
    exact = value.astimezone(UTC)
    return '<time datetime="{}" title="{}">{}</time>'.format(
        exact.isoformat(timespec="seconds").replace("+00:00", "Z"),
        exact.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative((now - value).total_seconds()),
    )


@register.filter
def age(value: datetime | str | None) -> SafeString | str:
    """A relative age, with the exact UTC time on hover (and for machines).

    Takes an ISO 8601 string too: the selectors' records carry their times as such.
    """
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None:
        return "—"
    return mark_safe(_time_element(value, timezone.now()))


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


_QUEUE_ROW = (
    '<tr data-href="{href}">\n'
    "{pick}"
    '        <td data-label="Key"><a class="key" href="{href}">{key}</a></td>\n'
    '        <td data-label="Action">{action}</td>\n'
    '        <td data-label="Provider">{provider}</td>\n'
    '        <td data-label="State" class="nowrap"><span class="badge state-{state}">{state}</span>'
    "{stranded}</td>\n"
    '        <td data-label="Reason">{reason}</td>\n'
    '        <td data-label="Waiting" class="nowrap">{waiting}</td>\n'
    '        <td data-label="Last lookup" class="nowrap">{lookup}</td>\n'
    '        <td data-label="Lookups" class="num">{lookups}</td>\n'
    '        <td data-label="Claimed by">{claimed}</td>\n'
    "      </tr>\n"
)
_PICK = (
    '        <td class="pick" data-label="Select"><input type="checkbox" form="bulk" name="op"'
    ' value="{pk}.{version}" aria-label="Select {key}"></td>\n'
)
_STRANDED = mark_safe(
    ' <span class="badge stranded" title="The host\'s receipt is still running although no'
    ' worker holds the dispatch">stranded</span>'
)
_NO_LOOKUP = mark_safe('<span class="muted">none yet</span>')
_UNCLAIMED = mark_safe('<span class="muted">—</span>')


@register.simple_tag
def queue_rows(rows: list[QueueRow], pickable: bool = True) -> SafeString:
    """The queue's rows (``<tr>``), each written by one format string.

    Not a template loop: fifty rows of twenty-odd nodes and a ``{% url %}`` each
    measured several milliseconds more of the queue page's median. Every text goes
    through ``html.escape`` (what Django's ``escape`` calls) and the rest is numbers and
    fixed markup; the operation's URL is reversed once, keys being URL-safe already
    (``recovery.contract.KEY_PATTERN``) and quoted as ``reverse`` quotes.
    """
    before, _, after = reverse("operation", args=["KEY"]).rpartition("KEY")
    now = timezone.now()
    written = []
    for row in rows:
        key = escape(row.key)
        verdict = row.latest_verdict
        if verdict:
            verdict = escape(verdict)
            at = "—" if row.latest_at is None else _time_element(row.latest_at, now)
            lookup = f'<span class="badge verdict-{verdict}">{verdict}</span> {at}'
        else:
            lookup = _NO_LOOKUP
        pick = _PICK.format(pk=int(row.pk), version=int(row.version), key=key) if pickable else ""
        written.append(
            _QUEUE_ROW.format(
                pick=pick,
                href=escape(before + quote(row.key, safe=RFC3986_SUBDELIMS + "~:@") + after),
                key=key,
                action=escape(row.action),
                provider=escape(row.provider),
                state=escape(row.state),
                stranded=_STRANDED if row.receipt_stranded else "",
                reason=escape(queue_reason(row)),
                waiting=_time_element(row.updated_at, now),
                lookup=lookup,
                lookups=int(row.lookup_count),
                claimed=escape(row.claimed_by.name) if row.claimed_by else _UNCLAIMED,
            )
        )
    return mark_safe("".join(written))  # every text above was escaped
