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
import re
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

from common.canonical import (
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
    return _finished(result)


def evidence_lookup_many(
    *, config: ProviderConfig, wanted: dict[str, str]
) -> dict[str, LookupResult]:
    """``evidence_lookup`` for many operations of one provider at once; never raises.

    ``wanted`` maps operation keys to params digests. A journal is read once, a SQLite
    database queried once per ``SQLITE_BATCH`` keys, an HTTP provider asked with at most
    ``HTTP_CONCURRENCY`` requests at a time. Each key's answer is judged by the same code
    as a single lookup's, so it is the answer ``evidence_lookup`` would give.
    """
    if not wanted:
        return {}
    many = _MANY_ADAPTERS.get(config.adapter)
    if many is None:
        return {
            key: evidence_lookup(config=config, operation_key=key, params_digest=digest)
            for key, digest in wanted.items()
        }
    try:
        found = many(config, wanted)
    except Exception as exc:  # the contract is "never raises"
        found = {
            key: _unavailable(
                f"The lookup failed unexpectedly ({type(exc).__name__}: {exc}).",
                error=f"{type(exc).__name__}: {exc}",
            )
            for key in wanted
        }
    return {key: _finished(found[key]) for key in wanted}


def _finished(result: LookupResult) -> LookupResult:
    """Every adapter's answer, made safe to compare and store (single and batch alike)."""
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
    return _sqlite_lookup_many(config, {operation_key: expected})[operation_key]


# Keys per query: well below SQLite's limit on bound parameters (999 before 3.32).
SQLITE_BATCH = 500


def _sqlite_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """Read ``orders`` and ``receipts`` for the keys in one read transaction, read-only.

    The provider commits both rows in one transaction, so half a pair (or a receipt whose
    digest does not match its own ``params_json``) means the record was damaged.
    """
    if not config.path:
        failed = _unavailable("No SQLite path is configured for this provider.", error="no_path")
        return dict.fromkeys(wanted, failed)
    uri = f"file:{urllib.parse.quote(config.path)}?mode=ro"
    try:
        connection = sqlite3.connect(
            uri, uri=True, timeout=config.timeout_seconds, isolation_level=None
        )
    except sqlite3.Error as exc:
        failed = _unavailable(
            f"The provider database could not be opened ({exc}).", error=str(exc), path=config.path
        )
        return dict.fromkeys(wanted, failed)
    # Text is read as bytes (below); a key's rows are found by its UTF-8 bytes.
    by_bytes = {key.encode("utf-8"): key for key in wanted}
    orders: dict[str, tuple[Any, ...]] = {}
    receipts: dict[str, tuple[Any, ...]] = {}
    try:
        # Text is read as bytes so that invalid UTF-8 is "corrupt", not a driver error.
        connection.text_factory = bytes
        connection.execute("PRAGMA query_only = ON")
        connection.execute("BEGIN")
        keys = list(wanted)
        for start in range(0, len(keys), SQLITE_BATCH):
            chunk = keys[start : start + SQLITE_BATCH]
            marks = ", ".join("?" * len(chunk))
            for row in connection.execute(
                "SELECT operation_key, reference, status, created_at FROM orders "
                f"WHERE operation_key IN ({marks})",
                chunk,
            ):
                _first_row(orders, by_bytes, row)
            for row in connection.execute(
                "SELECT operation_key, params_json, params_digest FROM receipts "
                f"WHERE operation_key IN ({marks})",
                chunk,
            ):
                _first_row(receipts, by_bytes, row)
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        failed = _unavailable(
            f"The provider database could not be read ({exc}).", error=str(exc), path=config.path
        )
        return dict.fromkeys(wanted, failed)
    finally:
        connection.close()
    return {
        key: _sqlite_verdict(key, expected, orders.get(key), receipts.get(key))
        for key, expected in wanted.items()
    }


def _first_row(
    rows: dict[str, tuple[Any, ...]], by_bytes: dict[bytes, str], row: tuple[Any, ...]
) -> None:
    key = by_bytes.get(row[0]) if isinstance(row[0], bytes) else None
    if key is not None:
        rows.setdefault(key, row)


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
    return _journal_lookup_many(config, {operation_key: expected})[operation_key]


def _journal_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """Stream the journal once; each key's answer is judged by its own ``_JournalKey``.

    A line concerns a key when it mentions the key's JSON text or parses to a record
    for that key. A line without a backslash spells every string it holds literally,
    so if it mentions none of the keys it cannot hold a record for one: it is skipped
    unparsed (most lines, for a journal much longer than the batch).
    """
    if not config.path:
        failed = _unavailable("No journal path is configured for this provider.", error="no_path")
        return dict.fromkeys(wanted, failed)
    readers = {key: _JournalKey(key, expected) for key, expected in wanted.items()}
    needles: dict[bytes, str] = {}
    for key in wanted:
        needles[json.dumps(key).encode("utf-8")] = key
        needles[json.dumps(key, ensure_ascii=False).encode("utf-8", "surrogatepass")] = key
    longest = max(len(needle) for needle in needles)
    literal = {needle[1:-1]: key for needle, key in needles.items() if b"\\" not in needle}
    try:
        with open(config.path, "rb") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                escaped = b"\\" in line
                if escaped:
                    mentioned = _mentioned(line, needles, longest)
                else:
                    mentioned = _mentioned_literally(line, literal)
                    if not mentioned:
                        continue
                record = _parse_journal_line(line)
                concerned = set(mentioned)
                if record is not None:
                    own = record.get("operation_key")
                    if isinstance(own, str) and own in readers:
                        concerned.add(own)
                for key in concerned:
                    reader = readers[key]
                    if reader.result is None:
                        reader.read(line_number, line, record, key in mentioned)
    except OSError as exc:
        failed = _unavailable(
            f"The provider journal could not be read ({exc}).", error=str(exc), path=config.path
        )
        return {key: reader.result or failed for key, reader in readers.items()}
    return {key: reader.answer() for key, reader in readers.items()}


_QUOTE = re.compile(b'"')


def _mentioned_literally(line: bytes, literal: dict[bytes, str]) -> set[str]:
    """``_mentioned`` for a line without a backslash, in one set intersection.

    Such a line can only hold needles without one, and a needle without a backslash has
    no quote inside: an occurrence runs from one quote of the line to the next, so it
    is exactly one of the pieces between consecutive quotes. ``literal`` maps those
    needles, quotes stripped, to their keys.
    """
    pieces = line.split(b'"')[1:-1]
    return {literal[piece] for piece in literal.keys() & pieces}


def _mentioned(line: bytes, needles: dict[bytes, str], longest: int) -> set[str]:
    """The keys whose JSON text (a needle) occurs anywhere in ``line``.

    Every needle starts and ends with a quote, so it can only occur between two quotes
    of the line at most ``longest`` bytes apart: those few slices are looked up.
    """
    if len(needles) <= 2:
        return {key for needle, key in needles.items() if needle in line}
    found: set[str] = set()
    quotes = [match.start() for match in _QUOTE.finditer(line)]
    for index, start in enumerate(quotes):
        for end in quotes[index + 1 :]:
            if end - start >= longest:
                break
            key = needles.get(line[start : end + 1])
            if key is not None:
                found.add(key)
    return found


class _JournalKey:
    """One key's reading of the journal: the highest ``seq`` for the key is the answer.

    Damage near the key (an unparsable line mentioning it, a bad checksum) makes the whole
    answer ``corrupt``: a damaged line might have been the latest word. Lines for other keys
    are none of this lookup's business, even when broken.
    """

    def __init__(self, operation_key: str, expected: str) -> None:
        self.operation_key = operation_key
        self.expected = expected
        self.best: dict[str, Any] | None = None
        self.best_line = 0
        self.result: LookupResult | None = None  # set once the answer is decided early

    def read(
        self, line_number: int, line: bytes, record: dict[str, Any] | None, mentions_key: bool
    ) -> None:
        """Take one line that mentions the key or parsed to a record for it."""
        if record is None:
            if mentions_key:
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                self.result = _corrupt(
                    f"Journal line {line_number} mentions this key but is not a valid JSON object.",
                    {"line_number": line_number, "line": _snippet(text)},
                )
            return
        if record.get("operation_key") != self.operation_key and not mentions_key:
            return
        if not _checksum_ok(record):
            self.result = _corrupt(
                f"Journal line {line_number} for this key has a bad checksum.",
                {"line_number": line_number, "record": record},
            )
            return
        if record.get("operation_key") != self.operation_key:
            return  # a sound line for another key that merely mentions this one
        seq = record.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            self.result = _corrupt(
                f"Journal line {line_number} for this key has no integer seq.",
                {"line_number": line_number, "record": record},
            )
            return
        best = self.best
        if best is None or seq > best["seq"]:
            self.best, self.best_line = record, line_number
        elif seq == best["seq"] and record != best:
            self.result = _corrupt(
                f"Journal lines {self.best_line} and {line_number} both claim seq {seq} "
                "for this key with different contents.",
                {"line_numbers": [self.best_line, line_number], "records": [best, record]},
            )

    def answer(self) -> LookupResult:
        if self.result is not None:
            return self.result
        best = self.best
        if best is None:
            return _result(ABSENT, "The provider journal has no line for this key.", {})
        raw = {"line_number": self.best_line, "record": best}
        problem = _check_record_fields(best, f"latest journal line (seq {best['seq']})")
        if problem is not None:
            return _corrupt(problem, raw)
        return _compare_digest(best, self.expected, raw, f"latest journal line (seq {best['seq']})")


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


# Requests in flight at once to one HTTP provider, for a batch of lookups.
HTTP_CONCURRENCY = 8


def _http_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """One ``GET`` per key, at most ``HTTP_CONCURRENCY`` at a time."""
    workers = min(HTTP_CONCURRENCY, len(wanted))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lookup") as pool:
        futures = {
            key: pool.submit(_http_lookup, config, key, expected)
            for key, expected in wanted.items()
        }
    return {key: future.result() for key, future in futures.items()}


_MANY_ADAPTERS: dict[str, Callable[[ProviderConfig, dict[str, str]], dict[str, LookupResult]]] = {
    "sqlite": _sqlite_lookup_many,
    "journal": _journal_lookup_many,
    "http": _http_lookup_many,
}

_ADAPTERS: dict[str, Callable[[ProviderConfig, str, str], LookupResult]] = {
    "sqlite": _sqlite_lookup,
    "journal": _journal_lookup,
    "http": _http_lookup,
}
