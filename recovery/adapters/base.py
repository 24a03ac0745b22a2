"""What every adapter shares: its configuration, its answer, and the verdict rules.

An adapter (``recovery.adapters``) only reads the provider's record; the rules that turn a
record into a verdict live here once, so a new adapter decides ``match``/``mismatch`` and
makes its answer storable the way the others do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.canonical import first_unsafe_integer, safe_integer
from recovery.models import Verdict

MATCH: str = Verdict.MATCH.value
MISMATCH: str = Verdict.MISMATCH.value
CORRUPT: str = Verdict.CORRUPT.value
ABSENT: str = Verdict.ABSENT.value
UNAVAILABLE: str = Verdict.UNAVAILABLE.value

PROVIDER_STATUSES = frozenset({"committed", "failed"})
SIGNATURE_HEADER = "X-Provider-Signature"

# Limits that keep one odd record from filling Settle's evidence table: the evidence row
# stores ``provider_reference`` in 200 characters and ``detail`` in 500.
MAX_REFERENCE_LENGTH = 200
MAX_DETAIL_LENGTH = 500
MAX_RECORD_BYTES = 1024 * 1024
MAX_RAW_TEXT = 2000


@dataclass(frozen=True)
class ProviderConfig:
    """How to reach one provider's record; mirrors ``recovery.models.Provider``."""

    adapter: str  # "sqlite" | "journal" | "http" | "mcp"
    path: str = ""
    url: str = ""
    secret: str = ""
    timeout_seconds: float = 5.0
    # An MCP server may be at a private address (``SETTLE_MCP_ALLOW_PRIVATE``).
    allow_private: bool = False


@dataclass(frozen=True)
class LookupResult:
    """What one lookup found, ready to be stored as evidence as-is."""

    verdict: str  # a recovery.models.Verdict value
    provider_status: str  # "committed" | "failed" | "" (when unknown)
    reference: str  # provider reference, "" if none
    raw: dict[str, Any]  # the raw record as read; JSON- and canonical-JSON-serialisable
    detail: str  # one human sentence explaining the verdict


# What an adapter implements: the answer for each key of a batch (operation key -> params
# digest) of one provider; a single lookup is a batch of one.
LookupMany = Callable[[ProviderConfig, dict[str, str]], dict[str, LookupResult]]


def finished(result: LookupResult) -> LookupResult:
    """Every adapter's answer, made safe to compare and store (single and batch alike)."""
    unsafe = first_unsafe_integer(result.raw)
    if unsafe is not None and result.verdict in (MATCH, MISMATCH):
        # Such a number cannot be compared or stored exactly: the record is not sound.
        result = corrupt(
            f"The provider's record holds the integer {unsafe}, outside ±(2^53-1).", result.raw
        )
    return _sanitised(result)


def verdict_result(
    verdict: str, detail: str, raw: dict[str, Any], *, status: str = "", reference: str = ""
) -> LookupResult:
    return LookupResult(
        verdict=verdict, provider_status=status, reference=reference, raw=raw, detail=detail
    )


def unavailable(detail: str, *, error: str, **extra: Any) -> LookupResult:
    return verdict_result(UNAVAILABLE, detail, {"error": error, **extra})


def corrupt(detail: str, raw: dict[str, Any]) -> LookupResult:
    """Untrusted record: its status and reference are reported as unknown ("")."""
    return verdict_result(CORRUPT, detail, raw)


def _clean_text(text: str) -> str:
    """Drop NUL characters and unpaired surrogates, which Postgres text cannot hold."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _json_safe(value: Any) -> Any:
    """A copy of ``value`` that both ``json`` and canonical JSON (RFC 8785) accept.

    Raw provider data is stored and digested verbatim, so whatever the provider wrote must
    survive that: NUL characters go, integers beyond ±(2^53-1) (``safe_integer``) and
    non-finite floats become text.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if safe_integer(value) else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _clean_text(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, dict):
        return {_clean_text(str(key)): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return _clean_text(repr(value))


def _sanitised(result: LookupResult) -> LookupResult:
    detail = _clean_text(result.detail)
    if len(detail) > MAX_DETAIL_LENGTH:
        detail = detail[: MAX_DETAIL_LENGTH - 1] + "…"
    return LookupResult(
        verdict=result.verdict,
        provider_status=result.provider_status
        if result.provider_status in PROVIDER_STATUSES
        else "",
        reference=_clean_text(result.reference),
        raw=_json_safe(result.raw),
        detail=detail,
    )


def snippet(text: str) -> str:
    """Raw text as stored with a verdict: long enough to show what was wrong."""
    return text if len(text) <= MAX_RAW_TEXT else text[:MAX_RAW_TEXT] + "…"


def record_problem(record: dict[str, Any], what: str) -> str | None:
    """Why a record is not well-formed, or ``None`` when it is: every adapter's rule, once
    its record is read into the three text fields ``params_digest``, ``reference``,
    ``status``."""
    for field in ("params_digest", "reference", "status"):
        if not isinstance(record.get(field), str):
            return f"The {what} has no text field {field!r}."
    if record["status"] not in PROVIDER_STATUSES:
        return f"The {what} has status {record['status']!r}, which is neither committed nor failed."
    if len(record["reference"]) > MAX_REFERENCE_LENGTH:
        return f"The {what} has a reference longer than {MAX_REFERENCE_LENGTH} characters."
    return None


def digest_verdict(
    record: dict[str, Any], expected_digest: str, raw: dict[str, Any], what: str
) -> LookupResult:
    """``match`` or ``mismatch`` for a record already known to be trustworthy."""
    status = str(record["status"])
    reference = str(record["reference"])
    if record["params_digest"] != expected_digest:
        return verdict_result(
            MISMATCH,
            f"The {what} is {status} with reference {reference!r}, but for parameters with "
            f"digest {record['params_digest']}, not this operation's {expected_digest}.",
            raw,
            status=status,
            reference=reference,
        )
    return verdict_result(
        MATCH,
        f"The {what} is {status} with reference {reference!r} for exactly these parameters.",
        raw,
        status=status,
        reference=reference,
    )
