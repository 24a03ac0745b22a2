"""Canonical JSON and the params digest that binds everything to "the exact action".

RFC 8785 (JCS) serialisation via ``rfc8785``; parsing is strict on top of the standard
library: duplicate keys, NaN/Infinity and non-finite floats are refused before anything
is stored, so a digest can always be recomputed from what Settle keeps.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import rfc8785

from common.errors import ErrorCode

MAX_PARAMS_BYTES = 64 * 1024
# A host's report may carry what the effect returned (the receipt's ``result``).
MAX_RESULT_BYTES = 16 * 1024
MAX_DEPTH = 10
# RFC 8785 serialises numbers as IEEE doubles: integers must be exact, |n| < 2^53.
MAX_SAFE_INTEGER = 2**53 - 1


def safe_integer(value: int) -> bool:
    """Within ±(2^53-1): representable exactly in canonical JSON, the one rule everywhere."""
    return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def first_unsafe_integer(value: Any) -> int | None:
    """The first integer in a JSON-like value that breaks ``safe_integer``, if any."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if safe_integer(value) else value
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list | tuple):
        for item in items:
            found = first_unsafe_integer(item)
            if found is not None:
                return found
    return None


class CanonicalError(ValueError):
    """Input that has no single canonical form Settle accepts; ``code`` is stable."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise CanonicalError(ErrorCode.DUPLICATE_KEY, f"duplicate key {key!r} in JSON object")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise CanonicalError(ErrorCode.NON_FINITE_NUMBER, f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CanonicalError(ErrorCode.NON_FINITE_NUMBER, f"{text} is out of the float range")
    return value


def strict_loads(data: bytes | str) -> Any:
    """Parse JSON, refusing duplicate keys, NaN/Infinity and overflowing numbers."""
    try:
        return json.loads(
            data,
            object_pairs_hook=_pairs_without_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except CanonicalError:
        raise
    except RecursionError as exc:
        raise CanonicalError(ErrorCode.TOO_DEEP, "JSON nesting is too deep") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CanonicalError(ErrorCode.MALFORMED_JSON, f"body is not valid JSON: {exc}") from exc


def _check_value(value: Any, depth: int) -> None:
    """Check one value; ``depth`` counts the objects and arrays around it, itself included."""
    if isinstance(value, (dict, list)) and depth > MAX_DEPTH:
        raise CanonicalError(ErrorCode.TOO_DEEP, f"params nest deeper than {MAX_DEPTH} levels")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if not safe_integer(value):
            raise CanonicalError(
                ErrorCode.INTEGER_OUT_OF_RANGE, f"integer {value} is outside ±(2^53-1)"
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalError(ErrorCode.NON_FINITE_NUMBER, "params hold a non-finite number")
        # Such a float is written as plain integer digits, which would read back as an
        # integer outside the safe range: refuse it now rather than after a round trip.
        if value.is_integer() and MAX_SAFE_INTEGER < abs(value) < 1e21:
            raise CanonicalError(ErrorCode.INTEGER_OUT_OF_RANGE, f"{value!r} is outside ±(2^53-1)")
        return
    if isinstance(value, str):
        _check_text(value)
        return
    if isinstance(value, list):
        for item in value:
            _check_value(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError(ErrorCode.INVALID_PARAMS, "object keys must be strings")
            _check_text(key)
            _check_value(item, depth + 1)
        return
    raise CanonicalError(ErrorCode.INVALID_PARAMS, f"{type(value).__name__} is not a JSON value")


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise CanonicalError(ErrorCode.INVALID_PARAMS, "strings may not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalError(ErrorCode.INVALID_PARAMS, "strings must be valid Unicode") from exc


def canonical_params(params: Any) -> str:
    """Return the canonical JSON text of a params object, or raise ``CanonicalError``."""
    if not isinstance(params, dict):
        raise CanonicalError(ErrorCode.INVALID_PARAMS, "params must be a JSON object")
    _check_value(params, 1)
    try:
        encoded = rfc8785.dumps(params)
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as exc:
        raise CanonicalError(
            ErrorCode.INVALID_PARAMS, f"params cannot be canonicalised: {exc}"
        ) from exc
    if len(encoded) > MAX_PARAMS_BYTES:
        raise CanonicalError(
            ErrorCode.PARAMS_TOO_LARGE,
            f"params are {len(encoded)} bytes canonical; the limit is {MAX_PARAMS_BYTES}",
        )
    return encoded.decode("utf-8")


def canonical_dumps(value: Any) -> bytes:
    """Canonical JSON bytes of any JSON value (audit content, journal lines).

    Every audit event is hashed over these bytes, so they are made often: a value that
    ``json.dumps`` spells exactly as RFC 8785 does (``canonical_plain``, and ASCII once written)
    is written by the standard library's C encoder; anything else by ``rfc8785``.
    """
    if canonical_plain(value):
        return canonical_plain_dumps(value)
    return rfc8785.dumps(value)


# One encoder for every call: ``json.dumps`` with arguments makes a new one each time.
_PLAIN_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_plain_dumps(value: Any) -> bytes:
    """``canonical_dumps`` of a value known to be ``canonical_plain`` (see ``plain_loads``).

    Skips the walk over the value that ``canonical_dumps`` makes to decide.
    """
    text = _PLAIN_ENCODER.encode(value)
    # ASCII text: every key sorts the same by code point as by UTF-16 unit.
    if text.isascii():
        return text.encode("ascii")
    return rfc8785.dumps(value)


class _NotPlain(Exception):
    pass


def _no_float(text: str) -> float:
    raise _NotPlain


def _safe_int(text: str) -> int:
    value = int(text)
    if not safe_integer(value):
        raise _NotPlain
    return value


def _no_constant(text: str) -> Any:
    raise _NotPlain


# Parses as ``json.loads`` does, but stops at a float (NaN and Infinity included) or an
# unsafe integer.
_PLAIN_DECODER = json.JSONDecoder(
    parse_float=_no_float, parse_int=_safe_int, parse_constant=_no_constant
)


def plain_loads(text: str) -> tuple[Any, bool]:
    """``json.loads(text)``, and whether that value is ``canonical_plain``, learnt while parsing.

    JSON text parses only to dicts with string keys, lists, strings, integers, floats,
    booleans and null: it is plain unless it holds a float or an integer outside
    ±(2^53-1), which the parser's number hooks see. For reading stored JSON (an audit
    event's ``data``) without walking it a second time.
    """
    try:
        return _PLAIN_DECODER.decode(text), True
    except _NotPlain:
        return json.loads(text), False


def canonical_plain(value: Any) -> bool:
    """Strings, safe integers, booleans, null, and dicts (string keys) and lists of them.

    Floats are spelled differently by the two encoders, and out-of-range integers and
    other types must fail as ``rfc8785`` fails them: those take the slow way.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if isinstance(item, str) or item is None or kind is bool:
            continue
        if kind is int:
            if not safe_integer(item):
                return False
        elif kind is dict:
            if not all(isinstance(key, str) for key in item):
                return False
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        else:
            return False
    return True


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def params_digest(canonical: str) -> str:
    """The ``sha256:<hex>`` digest of canonical params text."""
    return sha256_digest(canonical.encode("utf-8"))
