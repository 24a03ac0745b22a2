"""The JSONL journal adapter: one checksummed line per provider event, highest ``seq`` wins.

The journal is streamed once per batch, opened for reading only.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from common.canonical import CanonicalError, canonical_dumps, sha256_digest, strict_loads
from recovery.adapters.base import (
    ABSENT,
    MAX_RECORD_BYTES,
    LookupResult,
    ProviderConfig,
    corrupt,
    digest_verdict,
    record_problem,
    snippet,
    unavailable,
    verdict_result,
)


def _journal_checksum(record: dict[str, Any]) -> str:
    """``sha256:`` + hex of the canonical JSON of the line without its checksum."""
    body = {key: value for key, value in record.items() if key != "checksum"}
    return sha256_digest(canonical_dumps(body))


def journal_lookup(config: ProviderConfig, operation_key: str, expected: str) -> LookupResult:
    return journal_lookup_many(config, {operation_key: expected})[operation_key]


def journal_lookup_many(config: ProviderConfig, wanted: dict[str, str]) -> dict[str, LookupResult]:
    """Stream the journal once; each key's answer is judged by its own ``_JournalKey``.

    A line concerns a key when it mentions the key's JSON text or parses to a record
    for that key. A line without a backslash spells every string it holds literally,
    so if it mentions none of the keys it cannot hold a record for one: it is skipped
    unparsed (most lines, for a journal much longer than the batch).
    """
    if not config.path:
        failed = unavailable("No journal path is configured for this provider.", error="no_path")
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
        failed = unavailable(
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
                self.result = corrupt(
                    f"Journal line {line_number} mentions this key but is not a valid JSON object.",
                    {"line_number": line_number, "line": snippet(text)},
                )
            return
        if record.get("operation_key") != self.operation_key and not mentions_key:
            return
        if not _checksum_ok(record):
            self.result = corrupt(
                f"Journal line {line_number} for this key has a bad checksum.",
                {"line_number": line_number, "record": record},
            )
            return
        if record.get("operation_key") != self.operation_key:
            return  # a sound line for another key that merely mentions this one
        seq = record.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            self.result = corrupt(
                f"Journal line {line_number} for this key has no integer seq.",
                {"line_number": line_number, "record": record},
            )
            return
        best = self.best
        if best is None or seq > best["seq"]:
            self.best, self.best_line = record, line_number
        elif seq == best["seq"] and record != best:
            self.result = corrupt(
                f"Journal lines {self.best_line} and {line_number} both claim seq {seq} "
                "for this key with different contents.",
                {"line_numbers": [self.best_line, line_number], "records": [best, record]},
            )

    def answer(self) -> LookupResult:
        if self.result is not None:
            return self.result
        best = self.best
        if best is None:
            return verdict_result(ABSENT, "The provider journal has no line for this key.", {})
        raw = {"line_number": self.best_line, "record": best}
        problem = record_problem(best, f"latest journal line (seq {best['seq']})")
        if problem is not None:
            return corrupt(problem, raw)
        return digest_verdict(best, self.expected, raw, f"latest journal line (seq {best['seq']})")


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
