"""How an audit event is hashed, read back as a row, exported and checked against its chain.

Each event's ``hash`` is sha256 of the previous event's hash and the canonical JSON of
its own content (``event_hash``); a chain starts from ``GENESIS_HASH``. Verification
reads events as column tuples (``EventRow``, ``event_columns``) and hashes them without
building models; an exported event carries what is needed to check its hash offline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from django.db import connection
from django.utils.dateparse import parse_datetime

from audit.models import AuditEvent
from common.actors import Actor
from common.canonical import (
    canonical_dumps,
    canonical_plain_dumps,
    plain_loads,
    safe_integer,
    sha256_digest,
)

GENESIS_HASH = "sha256:" + "0" * 64
SYSTEM_CHAIN = ""
_TIMESTAMP = "%Y-%m-%dT%H:%M:%S.%fZ"


def timestamp(at: datetime) -> str:
    """The exact text of a moment that hashes and signatures cover (UTC, microseconds).

    A moment already in UTC (every one Django's clock and the database give) is written
    by ``isoformat``, the same text in half the time of ``strftime``'s (its offset,
    ``+00:00``, made ``Z``); ``strftime`` writes the rest, and years before 1000, which
    it does not pad.
    """
    if at.tzinfo is UTC and at.year >= 1000:
        return at.isoformat(timespec="microseconds")[:-6] + "Z"
    return at.astimezone(UTC).strftime(_TIMESTAMP)


def _content_hash(prev_hash: str, content: dict[str, Any], *, plain: bool = False) -> str:
    """sha256 of the previous hash's ASCII followed by the content's canonical JSON.

    ``content`` holds ``seq``, ``at`` (``timestamp``'s text), ``kind``,
    ``operation_key``, ``actor`` (its stored text) and ``data``: the one definition of
    an event's hash, for appending, verifying, and checking an export. ``plain``: the
    caller knows the content is plain JSON (``canonical.plain_loads``), so the
    same bytes are made without walking it first.
    """
    encoded = canonical_plain_dumps(content) if plain else canonical_dumps(content)
    return sha256_digest(prev_hash.encode("ascii") + encoded)


def event_hash(
    *,
    prev_hash: str,
    seq: int,
    at: datetime,
    kind: str,
    operation_key: str,
    actor: str,
    data: dict[str, Any],
) -> str:
    return _content_hash(
        prev_hash,
        {
            "seq": seq,
            "at": timestamp(at),
            "kind": kind,
            "operation_key": operation_key,
            "actor": actor,
            "data": data,
        },
    )


def event_digest(event: AuditEvent) -> str:
    """The hash ``event`` must carry: its ``prev_hash`` and its content, as stored."""
    return event_hash(
        prev_hash=event.prev_hash,
        seq=event.seq,
        at=event.at,
        kind=event.kind,
        operation_key=event.operation_key,
        actor=event.actor.stored if event.actor else "",
        data=event.data,
    )


class EventRow(NamedTuple):
    """An event as its columns hold it (``event_columns``): for reading many, no model.

    ``at`` is ``timestamp``'s text of the column, ``actor`` the column's text and
    ``data`` the column's JSON text; ``event_row_digest`` reads them as the model would.
    """

    chain: str
    seq: int
    at: str
    kind: str
    actor: str
    data: str
    prev_hash: str
    hash: str


# ``timestamp``'s text, made by PostgreSQL (to_char's YYYY pads to four digits, as
# ``strftime``'s %Y does for every year a ``datetime`` can hold from 1000 on).
_AT_TEXT = """to_char({table}at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def event_columns(table: str = "") -> str:
    """The SELECT list of an ``EventRow``; ``table`` qualifies the columns (``"e."``).

    Read the rows with ``event_rows``.
    """
    at = _AT_TEXT.format(table=table) if connection.vendor == "postgresql" else f"{table}at"
    columns = ["operation_key", "seq", at, "kind", "actor", "data", "prev_hash", "hash"]
    return ", ".join(column if column == at else table + column for column in columns)


def event_rows(fetched: list[tuple[Any, ...]]) -> Iterator[EventRow]:
    """``EventRow``s of rows a cursor fetched for ``event_columns``."""
    if connection.vendor == "postgresql":
        return map(EventRow._make, fetched)
    # SQLite: the column's text is naive UTC; the text hashed is ``timestamp``'s.
    return (EventRow(chain, seq, _sqlite_at(at), *rest) for chain, seq, at, *rest in fetched)


def _sqlite_at(value: str | datetime) -> str:
    if isinstance(value, str):
        parsed = parse_datetime(value)
        assert parsed is not None, value
        value = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return timestamp(value)


@lru_cache(maxsize=4096)
def _actor_hashed(stored: str) -> str:
    """The actor text ``event_digest`` hashes for this column text: the Actor read back."""
    return Actor.parse(stored).stored if stored else ""


def event_row_digest(row: EventRow) -> str:
    """``event_digest`` of the event whose columns are ``row``, without making the model."""
    return _row_digest_parsed(row)[0]


def _row_digest_parsed(row: EventRow) -> tuple[str, Any]:
    """``event_row_digest``, and the event's data as parsed to hash it."""
    data, plain = plain_loads(row.data)
    digest = _content_hash(
        row.prev_hash,
        {
            "seq": row.seq,
            "at": row.at,
            "kind": row.kind,
            "operation_key": row.chain,
            "actor": _actor_hashed(row.actor),
            "data": data,
        },
        # The other fields are text and seq: plain when seq is a safe integer.
        plain=plain and safe_integer(row.seq),
    )
    return digest, data


def event_export(event: AuditEvent) -> dict[str, Any]:
    """An event as an export carries it: every field its hash covers, as hashed.

    ``at`` is the exact text the hash covers (microseconds, UTC) and ``actor`` the
    stored ``kind:id:name``, so that ``exported_event_hash`` (or any RFC 8785
    implementation) recomputes ``hash`` from the record alone.
    """
    return {
        "id": event.pk,
        "at": timestamp(event.at),
        "chain": event.operation_key,
        "seq": event.seq,
        "kind": event.kind,
        "actor": event.actor.stored if event.actor else "",
        "data": event.data,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def exported_event_hash(record: dict[str, Any]) -> str:
    """The hash an exported event must carry, from its exported fields alone.

    ``data`` may be the object or its canonical JSON text (the CSV export's form).
    """
    data = record["data"]
    return _content_hash(
        str(record["prev_hash"]),
        {
            "seq": int(record["seq"]),
            "at": str(record["at"]),
            "kind": str(record["kind"]),
            "operation_key": str(record["chain"]),
            "actor": str(record["actor"]),
            "data": json.loads(data) if isinstance(data, str) else data,
        },
    )


@dataclass(frozen=True)
class ChainBreak:
    """Where a chain stops holding, and why: the first problem a check found.

    ``seq`` 0 and chain ``""`` for a problem of no one event (a checkpoint, an alarm).
    """

    chain: str
    seq: int
    reason: str

    def __str__(self) -> str:
        where = f"chain {self.chain!r}" if self.chain else "the system chain"
        return f"{where}, event #{self.seq}: {self.reason}" if self.seq else self.reason

    def as_record(self) -> dict[str, Any]:
        return {"chain": self.chain, "seq": self.seq, "reason": self.reason}


def event_row_break(row: EventRow, *, seq: int, prev_hash: str | None) -> ChainBreak | None:
    """Why the event ``row`` is not its chain's event ``seq`` linked onto ``prev_hash``, if so.

    ``prev_hash`` None: the previous event is not at hand (a checkpoint starting at a
    head it vouched for). The one rule of a link, for checkpoints and verification.
    """
    return event_row_linked(row, seq=seq, prev_hash=prev_hash) or event_row_content(row)[0]


def event_row_linked(row: EventRow, *, seq: int, prev_hash: str | None) -> ChainBreak | None:
    """The link half of ``event_row_break``: ``row`` is event ``seq`` and names
    ``prev_hash`` (None: not at hand) as its predecessor's hash."""
    if row.seq != seq:
        return ChainBreak(row.chain, seq, "this event is missing (deleted)")
    if prev_hash is not None and row.prev_hash != prev_hash:
        return ChainBreak(row.chain, row.seq, "prev_hash does not match the previous event")
    return None


def event_row_content(row: EventRow) -> tuple[ChainBreak | None, Any]:
    """The content half of ``event_row_break``: ``row``'s hash is its content's; and its
    data as parsed to hash it, when it is."""
    digest, data = _row_digest_parsed(row)
    if digest != row.hash:
        return ChainBreak(row.chain, row.seq, "content does not match its hash (edited)"), None
    return None, data
