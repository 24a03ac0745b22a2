"""Checking an export offline: every event's hash, the links between consecutive events,
and every signed decision against the passkeys its own system chain registered.

An export carries each event as it was hashed (``hashing.event_export``), so this needs
the file alone: no database. A signed decision is checked against the ``passkey_added``
event of its credential in the same export, so only an export that holds the system
chain (a supervisor's) can vouch for signatures; in any other, a signed decision fails as
signed with a passkey no event names.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from audit.hashing import GENESIS_HASH, SYSTEM_CHAIN, ChainBreak, exported_event_hash
from audit.signed_decisions import REGISTRATION_KINDS, SIGNED_KINDS, Passkeys


@dataclass
class ExportTally:
    events: int = 0
    signed_votes: int = 0


def export_verify(
    records: Iterable[dict[str, Any]], *, tally: ExportTally | None = None
) -> ChainBreak | None:
    """The first problem of the exported events ``records`` (in the export's order).

    A vote whose passkey's registration comes later in the file is checked at the end,
    against every registration the file holds.
    """
    tally = tally if tally is not None else ExportTally()
    passkeys = Passkeys()
    waiting: list[tuple[str, str, int, str, str, dict[str, Any]]] = []
    previous: dict[str, tuple[int, str]] = {}
    for record in records:
        tally.events += 1
        chain, seq = str(record["chain"]), int(record["seq"])
        if exported_event_hash(record) != record["hash"]:
            return ChainBreak(chain, seq, "content does not match its hash (edited)")
        last_seq, last_hash = previous.get(chain, (0, GENESIS_HASH))
        # A filtered export has gaps: only consecutive events can be linked.
        if seq == last_seq + 1 and record["prev_hash"] != last_hash:
            return ChainBreak(chain, seq, "prev_hash does not match the previous event")
        previous[chain] = (seq, str(record["hash"]))
        kind = str(record["kind"])
        if kind not in SIGNED_KINDS and kind not in REGISTRATION_KINDS:
            continue
        data = record["data"]
        data = json.loads(data) if isinstance(data, str) else data
        if chain == SYSTEM_CHAIN and kind in REGISTRATION_KINDS:
            passkeys.event(kind, str(record["at"]), data)
        elif kind in SIGNED_KINDS and "signature" in data:
            tally.signed_votes += 1
            vote = (kind, chain, seq, str(record["actor"]), str(record["at"]), data)
            credential = data["signature"].get("credential_id", "")
            if not passkeys.knows(str(credential)):
                waiting.append(vote)
                continue
            found = _vote_break(passkeys, *vote)
            if found is not None:
                return found
    for vote in waiting:
        found = _vote_break(passkeys, *vote)
        if found is not None:
            return found
    return None


def _vote_break(
    passkeys: Passkeys, kind: str, chain: str, seq: int, actor: str, at: str, data: dict[str, Any]
) -> ChainBreak | None:
    problem = passkeys.vote_problem(chain=chain, actor=actor, at=at, data=data, kind=kind)
    return None if problem is None else ChainBreak(chain, seq, problem)


def export_records(lines: Iterable[str], export_format: str) -> Iterator[dict[str, Any]]:
    """The event records of an export's lines (CSV or JSON Lines), its trailer left out."""
    if export_format == "csv":
        for row in csv.DictReader(line for line in lines if not line.startswith("#settle-")):
            yield dict(row)
        return
    for line in lines:
        if line.strip() and not line.startswith("#settle-"):
            yield json.loads(line)
