"""The params digest, computed the way Settle computes it, without Settle's code.

``sha256:`` + hex SHA-256 of the RFC 8785 (JCS) canonical JSON of the params object.
Settle refuses params that have no single canonical form: more than 64 KiB canonical,
nesting deeper than 10, non-finite numbers, integers outside ±(2^53-1) (and floats that
would be written as such integers), strings with NUL or lone surrogates, keys that are not
strings. This module refuses the same, with the same reason codes, before any request.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

MAX_PARAMS_BYTES = 64 * 1024
MAX_DEPTH = 10
MAX_SAFE_INTEGER = 2**53 - 1


class CanonicalError(ValueError):
    """Params Settle would refuse; ``reason`` is the code the server gives for them."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def canonical_params(params: Any) -> bytes:
    """The canonical JSON bytes of a params object, or ``CanonicalError``."""
    if not isinstance(params, dict):
        raise CanonicalError("invalid_params", "params must be a JSON object")
    parts: list[str] = []
    _write(params, 1, parts)
    encoded = "".join(parts).encode("utf-8")
    if len(encoded) > MAX_PARAMS_BYTES:
        raise CanonicalError(
            "params_too_large",
            f"params are {len(encoded)} bytes canonical; the limit is {MAX_PARAMS_BYTES}",
        )
    return encoded


def params_digest(params: Any) -> str:
    """``sha256:<hex>`` of the canonical params: what a permit binds to."""
    return "sha256:" + hashlib.sha256(canonical_params(params)).hexdigest()


def _write(value: Any, depth: int, out: list[str]) -> None:
    """Append the canonical text of ``value``; ``depth`` counts the containers, itself too."""
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalError("integer_out_of_range", f"integer {value} is outside ±(2^53-1)")
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, list | tuple):
        _check_depth(depth)
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, depth + 1, out)
        out.append("]")
    elif isinstance(value, dict):
        _check_depth(depth)
        for key in value:
            if not isinstance(key, str):
                raise CanonicalError("invalid_params", "object keys must be strings")
        out.append("{")
        # RFC 8785 sorts keys by their UTF-16 code units; big-endian bytes sort the same.
        for index, key in enumerate(sorted(value, key=_utf16)):
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(value[key], depth + 1, out)
        out.append("}")
    else:
        raise CanonicalError("invalid_params", f"{type(value).__name__} is not a JSON value")


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalError("too_deep", f"params nest deeper than {MAX_DEPTH} levels")


def _string(text: str) -> str:
    if "\x00" in text:
        raise CanonicalError("invalid_params", "strings may not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalError("invalid_params", "strings must be valid Unicode") from exc
    # The standard library escapes exactly what RFC 8785 escapes, and as it spells them.
    return json.dumps(text, ensure_ascii=False)


def _number(value: float) -> str:
    """A double as ECMAScript's Number.prototype.toString writes it (RFC 8785 §3.2.2.3)."""
    if not math.isfinite(value):
        raise CanonicalError("non_finite_number", "params hold a non-finite number")
    if value.is_integer() and MAX_SAFE_INTEGER < abs(value) < 1e21:
        # Written as plain integer digits, it would read back as an unsafe integer.
        raise CanonicalError("integer_out_of_range", f"{value!r} is outside ±(2^53-1)")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, which is what ECMAScript uses.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        head = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{head}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text
