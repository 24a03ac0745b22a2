"""Provider adapters: read the provider's own record of an operation, and nothing else.

An adapter answers exactly one question -- "what does the provider say happened for this
operation key, and was it done with exactly these parameters?" -- and turns the answer into
a :class:`LookupResult` whose ``verdict`` is a ``recovery.models.Verdict`` value:

``match``
    The provider holds a consistent record for the key with the operation's params digest.
    This includes a record whose status is ``failed``: that is the provider's definitive
    "not performed", and deciding what it means is the caller's business.
``mismatch``
    A consistent record exists, but for different parameters.
``corrupt``
    Something is there but cannot be trusted (half a record, bad checksum or signature,
    unparsable data, a digest that does not match its own parameters, an unknown status).
``absent``
    The provider was readable and holds nothing for the key.
``unavailable``
    The provider could not be read (missing file, lock, timeout, 5xx, misconfiguration,
    any unexpected error). It says nothing about whether the effect happened.

Adapters never write to a provider: SQLite files are opened read-only with ``query_only``,
journals are opened for reading, HTTP providers only get ``GET``. ``evidence_lookup`` never
raises, because a lookup that crashes the caller is worse than one that says "unavailable".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

from recovery.canonical import (
    CanonicalError,
    canonical_dumps,
    canonical_params,
    first_unsafe_integer,
    params_digest,
    safe_integer,
    sha256_digest,
    strict_loads,
)
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

    adapter: str  # "sqlite" | "journal" | "http"
    path: str = ""
    url: str = ""
    secret: str = ""
    timeout_seconds: float = 5.0


@dataclass(frozen=True)
class LookupResult:
    """What one lookup found, ready to be stored as evidence as-is."""

    verdict: str  # a recovery.models.Verdict value
    provider_status: str  # "committed" | "failed" | "" (when unknown)
    reference: str  # provider reference, "" if none
    raw: dict[str, Any]  # the raw record as read; JSON- and canonical-JSON-serialisable
    detail: str  # one human sentence explaining the verdict


def evidence_lookup(
    *, config: ProviderConfig, operation_key: str, params_digest: str
) -> LookupResult:
    """Look up the provider's evidence for ``operation_key``; never raises.

    Any unexpected exception becomes ``unavailable``: an adapter bug must not be mistaken
    for evidence either way, and the caller's retry/reconcile budget handles it.
    """
    adapter = _ADAPTERS.get(config.adapter)
    if adapter is None:
        result = _unavailable(
            f"Unknown provider adapter {config.adapter!r}; nothing was looked up.",
            error="unknown_adapter",
        )
    else:
        try:
            result = adapter(config, operation_key, params_digest)
        except Exception as exc:  # the contract is "never raises"
            result = _unavailable(
                f"The lookup failed unexpectedly ({type(exc).__name__}: {exc}).",
                error=f"{type(exc).__name__}: {exc}",
            )
    unsafe = first_unsafe_integer(result.raw)
    if unsafe is not None and result.verdict in (MATCH, MISMATCH):
        # Such a number cannot be compared or stored exactly: the record is not sound.
        result = _corrupt(
            f"The provider's record holds the integer {unsafe}, outside ±(2^53-1).", result.raw
        )
    return _sanitised(result)


# --------------------------------------------------------------------------- helpers


def _result(
    verdict: str, detail: str, raw: dict[str, Any], *, status: str = "", reference: str = ""
) -> LookupResult:
    return LookupResult(
        verdict=verdict, provider_status=status, reference=reference, raw=raw, detail=detail
    )


def _unavailable(detail: str, *, error: str, **extra: Any) -> LookupResult:
    return _result(UNAVAILABLE, detail, {"error": error, **extra})


def _corrupt(detail: str, raw: dict[str, Any]) -> LookupResult:
    """Untrusted record: its status and reference are reported as unknown ("")."""
    return _result(CORRUPT, detail, raw)


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


def _snippet(text: str) -> str:
    return text if len(text) <= MAX_RAW_TEXT else text[:MAX_RAW_TEXT] + "…"


def _check_record_fields(record: dict[str, Any], what: str) -> str | None:
    """Why a journal/HTTP record is not well-formed, or ``None`` when it is."""
    for field in ("params_digest", "reference", "status"):
        if not isinstance(record.get(field), str):
            return f"The {what} has no text field {field!r}."
    if record["status"] not in PROVIDER_STATUSES:
        return f"The {what} has status {record['status']!r}, which is neither committed nor failed."
    if len(record["reference"]) > MAX_REFERENCE_LENGTH:
        return f"The {what} has a reference longer than {MAX_REFERENCE_LENGTH} characters."
    return None


def _compare_digest(
    record: dict[str, Any], expected_digest: str, raw: dict[str, Any], what: str
) -> LookupResult:
    """``match`` or ``mismatch`` for a record already known to be trustworthy."""
    status = str(record["status"])
    reference = str(record["reference"])
    if record["params_digest"] != expected_digest:
        return _result(
            MISMATCH,
            f"The {what} is {status} with reference {reference!r}, but for parameters with "
            f"digest {record['params_digest']}, not this operation's {expected_digest}.",
            raw,
            status=status,
            reference=reference,
        )
    return _result(
        MATCH,
        f"The {what} is {status} with reference {reference!r} for exactly these parameters.",
        raw,
        status=status,
        reference=reference,
    )


# --------------------------------------------------------------------------- sqlite


def _sqlite_text(value: Any) -> str | None:
    """Column value as text, or ``None`` when it is not valid UTF-8 text."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _sqlite_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    """Read ``orders`` and ``receipts`` for the key in one read transaction, read-only.

    The provider commits both rows in one transaction, so half a pair (or a receipt whose
    digest does not match its own ``params_json``) means the record was damaged.
    """
    if not config.path:
        return _unavailable("No SQLite path is configured for this provider.", error="no_path")
    uri = f"file:{urllib.parse.quote(config.path)}?mode=ro"
    try:
        connection = sqlite3.connect(
            uri, uri=True, timeout=config.timeout_seconds, isolation_level=None
        )
    except sqlite3.Error as exc:
        return _unavailable(
            f"The provider database could not be opened ({exc}).", error=str(exc), path=config.path
        )
    try:
        # Text is read as bytes so that invalid UTF-8 is "corrupt", not a driver error.
        connection.text_factory = bytes
        connection.execute("PRAGMA query_only = ON")
        connection.execute("BEGIN")
        order_row = connection.execute(
            "SELECT operation_key, reference, status, created_at FROM orders "
            "WHERE operation_key = ?",
            (operation_key,),
        ).fetchone()
        receipt_row = connection.execute(
            "SELECT operation_key, params_json, params_digest FROM receipts "
            "WHERE operation_key = ?",
            (operation_key,),
        ).fetchone()
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        return _unavailable(
            f"The provider database could not be read ({exc}).", error=str(exc), path=config.path
        )
    finally:
        connection.close()
    return _sqlite_verdict(operation_key, expected, order_row, receipt_row)


def _sqlite_verdict(
    operation_key: str,
    expected: str,
    order_row: tuple[Any, ...] | None,
    receipt_row: tuple[Any, ...] | None,
) -> LookupResult:
    order = (
        None
        if order_row is None
        else dict(
            zip(("operation_key", "reference", "status", "created_at"), order_row, strict=True)
        )
    )
    receipt = (
        None
        if receipt_row is None
        else dict(zip(("operation_key", "params_json", "params_digest"), receipt_row, strict=True))
    )
    raw: dict[str, Any] = {"order": order, "receipt": receipt}
    if order is None and receipt is None:
        return _result(
            ABSENT, "The provider database has no order and no receipt for this key.", raw
        )
    if order is None:
        return _corrupt("The provider database has a receipt but no order for this key.", raw)
    if receipt is None:
        return _corrupt("The provider database has an order but no receipt for this key.", raw)

    texts = {name: _sqlite_text(value) for name, value in (*order.items(), *receipt.items())}
    for name in ("reference", "status", "params_json", "params_digest"):
        if texts[name] is None:
            return _corrupt(f"The provider's {name} column does not hold UTF-8 text.", raw)
    reference, status = str(texts["reference"]), str(texts["status"])
    params_json, stored_digest = str(texts["params_json"]), str(texts["params_digest"])

    if status not in PROVIDER_STATUSES:
        return _corrupt(
            f"The provider's order has status {status!r}, which is neither committed nor failed.",
            raw,
        )
    if len(reference) > MAX_REFERENCE_LENGTH:
        return _corrupt(
            f"The provider's order has a reference longer than {MAX_REFERENCE_LENGTH} characters.",
            raw,
        )
    try:
        recomputed = params_digest(canonical_params(strict_loads(params_json)))
    except CanonicalError as exc:
        return _corrupt(f"The provider's receipt holds unusable params_json ({exc.message}).", raw)
    if recomputed != stored_digest:
        return _corrupt(
            "The provider's receipt digest does not match its own params_json "
            f"(stored {stored_digest}, recomputed {recomputed}).",
            raw,
        )
    record = {"params_digest": stored_digest, "reference": reference, "status": status}
    return _compare_digest(record, expected, raw, "provider's order")


# --------------------------------------------------------------------------- journal


def _journal_checksum(record: dict[str, Any]) -> str:
    """``sha256:`` + hex of the canonical JSON of the line without its checksum."""
    body = {key: value for key, value in record.items() if key != "checksum"}
    return sha256_digest(canonical_dumps(body))


def _journal_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    """Stream the journal; the highest ``seq`` for the key is the provider's answer.

    Damage near the key (an unparsable line mentioning it, a bad checksum) makes the whole
    answer ``corrupt``: a damaged line might have been the latest word. Lines for other keys
    are none of this lookup's business, even when broken.
    """
    if not config.path:
        return _unavailable("No journal path is configured for this provider.", error="no_path")
    needles = {
        json.dumps(operation_key).encode("utf-8"),
        json.dumps(operation_key, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    }
    best: dict[str, Any] | None = None
    best_line = 0
    try:
        with open(config.path, "rb") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                mentions_key = any(needle in line for needle in needles)
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                record = _parse_journal_line(line)
                if record is None:
                    if mentions_key:
                        return _corrupt(
                            f"Journal line {line_number} mentions this key but is not a valid "
                            "JSON object.",
                            {"line_number": line_number, "line": _snippet(text)},
                        )
                    continue
                if record.get("operation_key") != operation_key and not mentions_key:
                    continue
                checksum_ok = _checksum_ok(record)
                if not checksum_ok:
                    return _corrupt(
                        f"Journal line {line_number} for this key has a bad checksum.",
                        {"line_number": line_number, "record": record},
                    )
                if record.get("operation_key") != operation_key:
                    continue  # a sound line for another key that merely mentions this one
                seq = record.get("seq")
                if not isinstance(seq, int) or isinstance(seq, bool):
                    return _corrupt(
                        f"Journal line {line_number} for this key has no integer seq.",
                        {"line_number": line_number, "record": record},
                    )
                if best is None or seq > best["seq"]:
                    best, best_line = record, line_number
                elif seq == best["seq"] and record != best:
                    return _corrupt(
                        f"Journal lines {best_line} and {line_number} both claim seq {seq} "
                        "for this key with different contents.",
                        {"line_numbers": [best_line, line_number], "records": [best, record]},
                    )
    except OSError as exc:
        return _unavailable(
            f"The provider journal could not be read ({exc}).", error=str(exc), path=config.path
        )
    if best is None:
        return _result(ABSENT, "The provider journal has no line for this key.", {})
    raw = {"line_number": best_line, "record": best}
    problem = _check_record_fields(best, f"latest journal line (seq {best['seq']})")
    if problem is not None:
        return _corrupt(problem, raw)
    return _compare_digest(best, expected, raw, f"latest journal line (seq {best['seq']})")


def _parse_journal_line(line: bytes) -> dict[str, Any] | None:
    if len(line) > MAX_RECORD_BYTES:
        return None
    try:
        parsed = strict_loads(line)
    except CanonicalError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _checksum_ok(record: dict[str, Any]) -> bool:
    checksum = record.get("checksum")
    if not isinstance(checksum, str):
        return False
    try:
        computed = _journal_checksum(record)
    except (ValueError, TypeError):  # rfc8785 refuses e.g. integers beyond 2^53
        return False
    return hmac.compare_digest(computed.encode("utf-8"), checksum.encode("utf-8", "replace"))


# --------------------------------------------------------------------------- http


def signature_valid(*, secret: str, body: bytes, signature: str) -> bool:
    """True when ``signature`` is the hex HMAC-SHA256 of ``body`` under ``secret``.

    Shared by lookups and signed callbacks. Compared as bytes, so any text a client
    sends is simply wrong rather than an error.
    """
    if not secret or not signature:
        return False
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    given = signature.strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected.encode("ascii"), given)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not the provider's answer; report the 3xx instead of following it."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _http_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    """``GET {url}/effects/{key}``; the body only counts when its HMAC signature verifies."""
    if not config.url:
        return _unavailable("No URL is configured for this provider.", error="no_url")
    if not config.secret:
        return _unavailable(
            "No signing secret is configured, so no provider answer could be verified.",
            error="no_secret",
        )
    url = f"{config.url.rstrip('/')}/effects/{urllib.parse.quote(operation_key, safe='')}"
    request = urllib.request.Request(url, method="GET", headers={"Accept": "application/json"})
    try:
        with _OPENER.open(request, timeout=config.timeout_seconds) as response:
            status_code = int(response.status)
            signature = response.headers.get(SIGNATURE_HEADER)
            body = response.read(MAX_RECORD_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            return _result(ABSENT, "The provider answered 404: it has no effect for this key.", {})
        return _unavailable(
            f"The provider answered HTTP {exc.code}, which is not an answer about this key.",
            error=f"http_{exc.code}",
            status=exc.code,
        )
    except (urllib.error.URLError, OSError, HTTPException, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return _unavailable(
            f"The provider could not be reached ({type(reason).__name__}: {reason}).",
            error=f"{type(reason).__name__}: {reason}",
            url=url,
        )
    if status_code != 200:
        return _unavailable(
            f"The provider answered HTTP {status_code}, which is not an answer about this key.",
            error=f"http_{status_code}",
            status=status_code,
        )
    return _http_verdict(config.secret, operation_key, expected, signature, body)


def _http_verdict(
    secret: str, operation_key: str, expected: str, signature: str | None, body: bytes
) -> LookupResult:
    text = body.decode("utf-8", "replace")
    raw: dict[str, Any] = {"body": _snippet(text)}
    if len(body) > MAX_RECORD_BYTES:
        return _corrupt(f"The provider's answer is larger than {MAX_RECORD_BYTES} bytes.", raw)
    if signature is None:
        return _corrupt(f"The provider's answer carries no {SIGNATURE_HEADER} header.", raw)
    if not signature_valid(secret=secret, body=body, signature=signature):
        return _corrupt("The provider's answer has a wrong signature.", raw)
    try:
        record = strict_loads(body)
    except CanonicalError as exc:
        return _corrupt(f"The provider's signed answer is not valid JSON ({exc.message}).", raw)
    if not isinstance(record, dict):
        return _corrupt("The provider's signed answer is not a JSON object.", raw)
    raw = {"record": record}
    if record.get("operation_key") != operation_key:
        return _corrupt(
            f"The provider answered about operation key {record.get('operation_key')!r}, "
            "not the one asked for.",
            raw,
        )
    problem = _check_record_fields(record, "provider's effect record")
    if problem is not None:
        return _corrupt(problem, raw)
    return _compare_digest(record, expected, raw, "provider's effect record")


_ADAPTERS: dict[str, Callable[[ProviderConfig, str, str], LookupResult]] = {
    "sqlite": _sqlite_lookup,
    "journal": _journal_lookup,
    "http": _http_lookup,
}
