"""The exact action in plain words: an action's summary rendered from its parameters.

summary
    The policy's ``[[actions]]`` sentence for the action (``policies.rules.ActionSummary``)
    with each placeholder replaced by its parameter: as written for a string, as JSON
    text otherwise; ``money`` through Babel in the reader's locale, never rounded (an
    amount of 12.345 reads €12.345: the reader approves the parameter, not a rounding of
    it); ``date`` and ``datetime`` from ISO 8601 strings, a datetime in its own offset
    (one without an offset says no time in particular, and is refused).
parameter list
    What a page shows instead when there is no sentence: every parameter, a nested one
    named by its JSON Pointer (``/to/iban``), a string as written, anything else as
    JSON text. ``Summary.unavailable`` says why there is no sentence: no entry for the
    action, or a placeholder whose parameter is missing, of the wrong type, a currency
    Babel does not know, or not a date. A summary is all or nothing: a sentence with a
    gap could read as another action.

The values come from the parameters alone, which the params digest covers; the text is
plain, for the template's autoescape to escape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from babel import Locale, UnknownLocaleError
from babel.dates import format_date, format_datetime
from babel.numbers import format_currency, is_currency

from policies.rules import Placeholder, Policy

DEFAULT_LOCALE = "en"
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")
CURRENCY = re.compile(r"[A-Z]{3}")
_MISSING = object()


@dataclass(frozen=True)
class Summary:
    """The action's sentence, or (``sentence`` empty) why there is none; and every
    parameter as (JSON Pointer, value) rows, for the page to list either way."""

    sentence: str
    params: tuple[tuple[str, str], ...]
    unavailable: str = ""

    @property
    def rendered(self) -> bool:
        return bool(self.sentence)


class _Unavailable(Exception):
    """A placeholder that cannot be filled: the reason a page shows."""


def action_summary(
    policy: Policy, provider: str, action: str, params: Any, *, locale: str = DEFAULT_LOCALE
) -> Summary:
    """``action`` of ``provider`` in plain words under ``policy``, in ``locale`` (a
    language tag such as ``de`` or ``en-GB``; an unknown one reads as English)."""
    rows = params_list(params)
    entry = policy.summary_for(provider=provider, action=action)
    if entry is None:
        return Summary("", rows, f"the policy has no summary for {provider} {action}")
    reader = _locale(locale)
    try:
        sentence = "".join(
            part if isinstance(part, str) else _render(part, params, reader) for part in entry.parts
        )
    except _Unavailable as exc:
        return Summary("", rows, str(exc))
    return Summary(sentence, rows)


def params_list(params: Any) -> tuple[tuple[str, str], ...]:
    """Every parameter as (JSON Pointer, value), objects and arrays flattened."""
    rows: list[tuple[str, str]] = []

    def walk(value: Any, pointer: str) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{pointer}/{_escape(str(key))}")
        elif isinstance(value, list) and value:
            for index, item in enumerate(value):
                walk(item, f"{pointer}/{index}")
        else:
            rows.append((pointer or "/", _text(value)))

    walk(params, "")
    return tuple(rows)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _locale(tag: str) -> Locale:
    try:
        return Locale.parse(tag.replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError):
        return Locale.parse(DEFAULT_LOCALE)


def _value(pointer: Any, params: Any) -> Any:
    found = pointer.resolve(params, _MISSING)
    if found is _MISSING:
        raise _Unavailable(f"{pointer.path or '/'} missing")
    return found


def _render(placeholder: Placeholder, params: Any, locale: Locale) -> str:
    value = _value(placeholder.pointer, params)
    where = placeholder.pointer.path
    if placeholder.format == "money":
        assert placeholder.currency is not None
        currency = _value(placeholder.currency, params)
        return _money(value, currency, where, placeholder.currency.path, locale)
    if placeholder.format == "date":
        try:
            day = date.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            day = None
        if day is None:
            raise _Unavailable(f"{where} is not an ISO 8601 date")
        return format_date(day, format="long", locale=locale)
    if placeholder.format == "datetime":
        try:
            moment = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise _Unavailable(f"{where} is not an ISO 8601 date and time with its offset")
        return format_datetime(moment, format="long", tzinfo=moment.tzinfo, locale=locale)
    return _text(value)


def _money(amount: Any, currency: Any, where: str, code_at: str, locale: Locale) -> str:
    if isinstance(amount, bool) or not isinstance(amount, int | float | str):
        raise _Unavailable(f"{where} is not an amount")
    text = amount if isinstance(amount, str) else str(amount)
    try:
        number = Decimal(text) if DECIMAL.fullmatch(text) or not isinstance(amount, str) else None
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite():
        raise _Unavailable(f"{where} is not an amount")
    if not isinstance(currency, str) or not CURRENCY.fullmatch(currency):
        raise _Unavailable(f"{code_at} is not a currency code such as EUR")
    if not is_currency(currency):
        raise _Unavailable(f"{code_at}: {currency} is not a currency")
    return format_currency(number, currency, locale=locale, decimal_quantization=False)
