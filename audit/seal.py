"""The log's seal: the audit key's signature on checkpoints, vouched heads and alarms.

Not a person's signature (``common.statements`` and ``audit.signed_decisions`` hold
those): an HMAC under the server's audit key (``SETTLE_AUDIT_KEY``). The key is not in
the database, so someone with SQL access alone can neither forge a checkpoint, a vouched
head or an alarm, nor re-sign one they changed.

A checkpoint's digest covers its number, time, scan bounds, heads, broken chains and
its predecessor's digest; large heads are hashed a head at a time
(``checkpoint_hashes_streamed``) so that memory does not grow with the chains. A vouched
head's signature binds chain, seq, hash and the checkpoint that signed it. A
checkpoint's line in the checkpoint file is written and read here too
(``checkpoint_file_line``, ``checkpoint_of_line``), beside the digest it carries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings

from audit.hashing import _TIMESTAMP, timestamp
from audit.models import AuditCheckpoint, AuditVouchedHead
from common.canonical import (
    canonical_dumps,
    canonical_plain,
    canonical_plain_dumps,
    plain_loads,
    safe_integer,
    sha256_digest,
)

logger = logging.getLogger("settle.audit")


def sign(digest: str) -> str:
    """The HMAC of ``digest`` under the audit key: what only the key's holder can make."""
    key = str(settings.SETTLE_AUDIT_KEY).encode("utf-8")
    return "hmac-sha256:" + hmac.digest(key, digest.encode("ascii"), "sha256").hex()


def signed_by_key(digest: str, signature: str) -> bool:
    return hmac.compare_digest(sign(digest), signature)


def checkpoint_content(checkpoint: AuditCheckpoint) -> dict[str, Any]:
    return _content(checkpoint, checkpoint.heads)


def _content(checkpoint: AuditCheckpoint, heads: Any) -> dict[str, Any]:
    content: dict[str, Any] = {
        "number": checkpoint.number,
        "made_at": timestamp(checkpoint.made_at),
        "rescan_from": checkpoint.rescan_from,
        "watermark": checkpoint.watermark,
        "heads": heads,
        "prev_digest": checkpoint.prev_digest,
    }
    if checkpoint.broken:  # absent from checkpoints that found nothing, as before it existed
        content["broken"] = checkpoint.broken
    return content


def checkpoint_digest(checkpoint: AuditCheckpoint, *, heads_plain: bool = False) -> str:
    """The digest a checkpoint signs; ``heads_plain``: its heads are known plain JSON
    (``plain_loads``), so the one large part of it is not walked again."""
    content = checkpoint_content(checkpoint)
    if heads_plain and canonical_plain({**content, "heads": {}}):
        return sha256_digest(canonical_plain_dumps(content))
    return sha256_digest(canonical_dumps(content))


# A head as PostgreSQL (``jsonb::text``) or SQLite (``json_each``) spells it: a safe
# integer and a printable ASCII text without quote or backslash, which canonical JSON and
# ``json.dumps`` write the same, verbatim.
_PLAIN_HEAD = re.compile(r'\[(0|[1-9][0-9]{0,15}), ?"([ !#-\[\]-~]*)"\]')


_PLAIN_KEY = re.compile(r"[ !#-\[\]-~]*")


def _head_pieces(key: str, value_text: str) -> tuple[bytes, bytes]:
    """One head's canonical bytes (``"key":value``) and its file line's (``"key": value``)."""
    plain = _PLAIN_HEAD.fullmatch(value_text)
    if plain is not None and _PLAIN_KEY.fullmatch(key) and safe_integer(int(plain[1])):
        canonical = f'"{key}":[{plain[1]},"{plain[2]}"]'
        return canonical.encode("ascii"), f'"{key}": [{plain[1]}, "{plain[2]}"]'.encode("ascii")
    value = json.loads(value_text)
    canonical_key = canonical_dumps(key)
    return (
        canonical_key + b":" + canonical_dumps(value),
        (json.dumps(key) + ": " + json.dumps(value, sort_keys=True)).encode("ascii"),
    )


def checkpoint_hashes_streamed(
    checkpoint: AuditCheckpoint, heads: Iterable[tuple[str, str]]
) -> tuple[str, bytes] | None:
    """``checkpoint_digest`` and the sha256 of ``checkpoint_file_line``, the heads hashed
    one at a time as they come, never held together.

    ``heads``: (chain, the JSON text of its head) in code point order. Only for ASCII
    chains (an operation key is ASCII; the system chain is ""), where code point order is
    RFC 8785's order (UTF-16 code units) and ``json.dumps``'s: None at the first other
    one, and the caller hashes the checkpoint whole (``checkpoint_digest``).
    """
    # The content around the heads: texts that JSON escapes inside strings cannot hold
    # '"heads":{}' unescaped, so its first occurrence is the key itself.
    around = canonical_dumps(_content(checkpoint, {})).split(b'"heads":{}', 1)
    line = checkpoint_file_line(checkpoint, heads={})
    line_around = line.encode("ascii").split(b'"heads": {}', 1)
    digest = hashlib.sha256(around[0] + b'"heads":{')
    line_sha = hashlib.sha256(line_around[0] + b'"heads": {')
    first = True
    for key, value_text in heads:
        if not key.isascii():
            return None
        canonical, spelled = _head_pieces(key, value_text)
        if not first:
            digest.update(b",")
            line_sha.update(b", ")
        first = False
        digest.update(canonical)
        line_sha.update(spelled)
    digest.update(b"}" + around[1])
    line_sha.update(b"}" + line_around[1])
    return "sha256:" + digest.hexdigest(), line_sha.digest()


def vouched_digest(*, chain: str, seq: int, hash: str, checkpoint: int) -> str:
    content = {"chain": chain, "seq": seq, "hash": hash, "checkpoint": checkpoint}
    if safe_integer(seq) and safe_integer(checkpoint):  # and two texts: plain
        return sha256_digest(canonical_plain_dumps(content))
    return sha256_digest(canonical_dumps(content))


def vouched_signed(vouched: AuditVouchedHead) -> bool:
    return vouched_row_signed(
        chain=vouched.chain,
        seq=vouched.seq,
        hash=vouched.hash,
        checkpoint=vouched.checkpoint,
        signature=vouched.signature,
    )


def vouched_row_signed(*, chain: str, seq: int, hash: str, checkpoint: int, signature: str) -> bool:
    digest = vouched_digest(chain=chain, seq=seq, hash=hash, checkpoint=checkpoint)
    return signed_by_key(digest, signature)


def checkpoint_file_line(checkpoint: AuditCheckpoint, *, heads: Any = None) -> str:
    """The checkpoint's line in ``SETTLE_AUDIT_CHECKPOINT_FILE`` (without its newline).

    ``heads``: written in place of the checkpoint's own (``checkpoint_hashes_streamed``
    hashes the line around an empty one, its heads streamed).
    """
    line = {
        **_content(checkpoint, checkpoint.heads if heads is None else heads),
        "digest": checkpoint.digest,
        "signature": checkpoint.signature,
    }
    return json.dumps(line, sort_keys=True)


# A line's end as ``checkpoint_file_line`` spells it: the keys after ``heads`` in order.
CHECKPOINT_LINE_TAIL = re.compile(
    rb'"number": ([0-9]+), "prev_digest": "[^"\\]*", "rescan_from": [0-9]+, '
    rb'"signature": "([^"\\]*)", "watermark": [0-9]+\}$'
)


def checkpoint_of_line(line: str) -> tuple[AuditCheckpoint, bool]:
    """The checkpoint a file line holds (unsaved), and whether its JSON is plain
    (``plain_loads``). ``ValueError``, ``KeyError`` or ``TypeError``: not a line."""
    record, plain = plain_loads(line)
    made_at = datetime.strptime(record["made_at"], _TIMESTAMP)
    checkpoint = AuditCheckpoint(
        number=int(record["number"]),
        made_at=made_at.replace(tzinfo=UTC),
        rescan_from=int(record["rescan_from"]),
        watermark=int(record["watermark"]),
        heads=record["heads"],
        broken=record.get("broken", []),
        prev_digest=str(record["prev_digest"]),
        digest=str(record["digest"]),
        signature=str(record["signature"]),
    )
    return checkpoint, plain
