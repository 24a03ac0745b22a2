"""The statement a person signs with a passkey: what it says, how it is built, how it is read.

statement
    What is decided, as a JSON object: ``kind`` (``approval``, ``reconciliation``,
    ``bulk``), the fields that name its subject (``SUBJECTS``, built by one function per
    kind: ``approval_subject``, ``reconciliation_subject``, ``bulk_subject``), the
    ``decision``, the ``person`` (an actor's stored text), a random ``nonce`` and the
    moment ``at``.
challenge
    The SHA-256 of the statement's canonical JSON: what the browser asks the passkey to
    sign, so that the signature names the statement and nothing else.

The console builds a statement from its rows, the deciding services check that a signed
one is their decision, and the audit log reads the same subject back from an event's
data: all through the builders here, so the three cannot disagree on what is signed.
Checking the passkey's signature over the challenge is ``common.webauthn``'s.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fido2.utils import websafe_encode

from common.canonical import canonical_dumps

# The fields that name what a statement of each kind decides, and its decisions. A
# reconciliation request names the decision it proposes (``action``: confirm, void,
# repair); a bulk batch its action and the digest of the (operation, version) pairs it
# froze, so that a signature approves these very operations and no others.
SUBJECTS: dict[str, tuple[str, ...]] = {
    "approval": ("approval_id", "operation_key", "params_digest"),
    "reconciliation": ("request_id", "operation_key", "params_digest", "action"),
    "bulk": ("batch_id", "action", "items", "items_digest"),
}
DECISIONS: dict[str, tuple[str, ...]] = {
    "approval": ("approve", "deny"),
    "reconciliation": ("approve", "reject"),
    "bulk": ("approve", "reject"),
}


def approval_subject(
    *, approval_id: object, operation_key: object, params_digest: object
) -> dict[str, object]:
    """What a signed decision on an approval names: it, its operation and the digest of
    the parameters it approves."""
    return {
        "approval_id": approval_id,
        "operation_key": operation_key,
        "params_digest": params_digest,
    }


def reconciliation_subject(
    *, request_id: object, operation_key: object, params_digest: object, action: object
) -> dict[str, object]:
    """What a signed decision on a reconciliation request names: the request, its
    operation and parameters, and the decision it proposes."""
    return {
        "request_id": request_id,
        "operation_key": operation_key,
        "params_digest": params_digest,
        "action": action,
    }


def bulk_subject(
    *, batch_id: object, action: object, items: object, items_digest: object
) -> dict[str, object]:
    """What a signed decision on a bulk batch names: the batch, its action, how many
    operations it froze and the digest of their (operation, version) pairs."""
    return {"batch_id": batch_id, "action": action, "items": items, "items_digest": items_digest}


def statement(
    kind: str,
    subject: Mapping[str, object] | None = None,
    *,
    decision: str,
    person: str,
    nonce: str | None = None,
    at: datetime | None = None,
    **fields: object,
) -> dict[str, str]:
    """The statement of ``person``'s ``decision`` on the subject ``subject`` (a mapping)
    and ``fields`` name together.

    ``nonce`` and ``at`` default to 16 random bytes and now: two statements of the same
    decision never share a challenge.
    """
    subject = {**(subject or {}), **fields}
    if kind not in SUBJECTS:
        raise ValueError(f"no signed decision of kind {kind!r}")
    if sorted(subject) != sorted(SUBJECTS[kind]):
        raise ValueError(f"a {kind} statement names {', '.join(SUBJECTS[kind])}")
    if decision not in DECISIONS[kind]:
        raise ValueError(f"a {kind} decision is one of {', '.join(DECISIONS[kind])}")
    moment = at if at is not None else datetime.now(UTC)
    return {
        "kind": kind,
        **{name: str(value) for name, value in subject.items()},
        "decision": decision,
        "person": person,
        "nonce": nonce if nonce is not None else websafe_encode(secrets.token_bytes(16)),
        "at": moment.astimezone(UTC).isoformat(),
    }


def challenge_of(statement: Mapping[str, Any]) -> bytes:
    """The challenge a passkey signs for ``statement``: SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_dumps(dict(statement))).digest()


def statement_matches(
    record: Mapping[str, Any], kind: str, *, decision: str, person: str, **subject: object
) -> bool:
    """Whether ``record`` signs this very ``decision`` of ``kind`` on the subject
    ``subject`` names (every field of ``SUBJECTS[kind]``), by this person."""
    signed = record.get("statement")
    if not isinstance(signed, Mapping) or sorted(subject) != sorted(SUBJECTS.get(kind, ())):
        return False
    expected = {
        "kind": kind,
        **{name: str(value) for name, value in subject.items()},
        "decision": decision,
        "person": person,
    }
    return all(signed.get(name) == value for name, value in expected.items())
