"""What a checkpoint and a vouched head sign: their canonical content and its digest.

A checkpoint's digest covers its number, time, scan bounds, heads, broken chains and
its predecessor's digest; large heads are hashed a head at a time
(``checkpoint_hashes_streamed``) so that memory does not grow with the chains. A vouched
head's signature binds chain, seq, hash and the checkpoint that signed it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from audit.hashing import timestamp
from audit.keys import signed_by_key
from audit.models import AuditCheckpoint, AuditVouchedHead
from common.canonical import (
    canonical_dumps,
    canonical_plain,
    canonical_plain_dumps,
    safe_integer,
    sha256_digest,
)

logger = logging.getLogger("settle.audit")


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
    line = {**_content(checkpoint, {}), "digest": checkpoint.digest}
    line["signature"] = checkpoint.signature
    line_around = json.dumps(line, sort_keys=True).encode("ascii").split(b'"heads": {}', 1)
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
