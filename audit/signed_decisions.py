"""Signed decisions on the audit log, checked against the passkeys the log itself names.

A person's signature (``common.statements``, ``common.webauthn``), not the log's own
seal under the audit key (``audit.seal``).

A decision's event that carries a ``signature`` (``common.webauthn``'s record): an
``approval_voted``, a ``reconciliation_approved`` or ``_rejected`` on the operation's
chain, a ``bulk_approved`` or ``_rejected`` on the system chain. It holds when: the
system chain's ``passkey_added`` event for its credential registered it to the event's
actor no later than the decision, and no ``passkey_removed`` event removed it before
(for a host's customer, a ``party`` actor: ``party_passkey_added`` and ``_removed``);
the statement it signs is this decision (``_signed_subject``: its kind, subject,
decision and person); and the passkey's signature over that statement's challenge
verifies under the public key the ``passkey_added`` event recorded.

Nothing here trusts the rows of allauth or the vote: a passkey removed long ago still
verifies the decisions it signed while it was registered, from the log alone. The
same check serves ``verify_audit`` (keys loaded once from the database) and an export
verified offline (keys read from its own system chain's events, ``Passkeys.event``).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from audit.hashing import (
    SYSTEM_CHAIN,
    ChainBreak,
    EventRow,
    event_row_content,
    event_row_linked,
    timestamp,
)
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.statements import (
    approval_subject,
    bulk_subject,
    reconciliation_subject,
    statement_matches,
)
from common.webauthn import SignatureInvalid, assertion_verify

VOTED = AuditKind.APPROVAL_VOTED.value
ADDED = AuditKind.PASSKEY_ADDED.value
REMOVED = AuditKind.PASSKEY_REMOVED.value
# A host's customer's passkeys, enrolled through the host's app: they sign the customer's
# own decisions (``approval_voted`` by a ``party`` actor), checked the same way.
PARTY_ADDED = AuditKind.PARTY_PASSKEY_ADDED.value
PARTY_REMOVED = AuditKind.PARTY_PASSKEY_REMOVED.value
# The system chain's events that register a passkey to someone, or remove it.
REGISTRATION_KINDS = (ADDED, REMOVED, PARTY_ADDED, PARTY_REMOVED)
_APPROVED = (AuditKind.RECONCILIATION_APPROVED.value, AuditKind.BULK_APPROVED.value)
_RECONCILED = (AuditKind.RECONCILIATION_APPROVED.value, AuditKind.RECONCILIATION_REJECTED.value)
# The kinds of event that may carry a signed decision.
SIGNED_KINDS = frozenset(
    (VOTED, *_RECONCILED, AuditKind.BULK_APPROVED.value, AuditKind.BULK_REJECTED.value)
)
# A decision's JSON text holds this key only when it was signed: others are not parsed again.
SIGNED_MARK = '"signature"'


def _signed_subject(kind: str, chain: str, data: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """The statement an event of ``kind`` signs, as ``statement_matches`` takes it: the
    statement's kind, the decision and the fields that name the subject."""
    if kind == VOTED:
        return (
            "approval",
            str(data.get("decision", "")),
            approval_subject(
                approval_id=data.get("approval_id", ""),
                operation_key=chain,
                params_digest=data.get("params_digest", ""),
            ),
        )
    decision = "approve" if kind in _APPROVED else "reject"
    if kind in _RECONCILED:
        return (
            "reconciliation",
            decision,
            reconciliation_subject(
                request_id=data.get("request_id", ""),
                operation_key=chain,
                params_digest=data.get("params_digest", ""),
                action=data.get("action", ""),
            ),
        )
    return (
        "bulk",
        decision,
        bulk_subject(
            batch_id=data.get("batch", ""),
            action=data.get("action", ""),
            items=data.get("items", ""),
            items_digest=data.get("items_digest", ""),
        ),
    )


@dataclass
class _Registration:
    public_key: str
    owner: str  # whose it is, as an actor's ``identity`` names them: ``user:7``, ``party:3``
    added_at: str  # ``timestamp`` text: compared as text, which sorts as time
    removed_at: str | None = None


def _any_origin(origin: str) -> bool:
    # Which host served the console when it was signed is not on the log; the origin
    # must still be one the relying party the authenticator signed for may use.
    return True


class Passkeys:
    """Every passkey the system chain registered, by credential id, and when it went."""

    def __init__(self) -> None:
        self._by_credential: dict[str, list[_Registration]] = {}

    @classmethod
    def stored(cls) -> Passkeys:
        """The passkeys of the stored system chain, in one statement."""
        passkeys = cls()
        rows = (
            AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN, kind__in=REGISTRATION_KINDS)
            .order_by("id")
            .values_list("kind", "at", "data")
        )
        for kind, at, data in rows.iterator(chunk_size=2000):
            passkeys.event(kind, timestamp(at), data)
        return passkeys

    def event(self, kind: str, at: str, data: dict[str, Any]) -> None:
        """Take in a system chain's event of ``REGISTRATION_KINDS``."""
        credential = str(data.get("credential_id", ""))
        if kind in (ADDED, PARTY_ADDED):
            owner = (
                f"user:{data.get('user_id', '')}"
                if kind == ADDED
                else f"party:{data.get('party_id', '')}"
            )
            registration = _Registration(str(data.get("public_key", "")), owner, at)
            self._by_credential.setdefault(credential, []).append(registration)
        elif kind in (REMOVED, PARTY_REMOVED):
            for registration in self._by_credential.get(credential, []):
                if registration.removed_at is None:
                    registration.removed_at = at

    def knows(self, credential_id: str) -> bool:
        return credential_id in self._by_credential

    def vote_problem(
        self, *, chain: str, actor: str, at: str, data: dict[str, Any], kind: str = VOTED
    ) -> str | None:
        """Why the signed decision (the fields of an event of ``kind``, one of
        ``SIGNED_KINDS``) does not hold, if so."""
        problem, public_key = self.vote_precheck(
            chain=chain, actor=actor, at=at, data=data, kind=kind
        )
        if problem is not None:
            return problem
        return signature_problem(public_key, data["signature"])

    def vote_precheck(
        self, *, chain: str, actor: str, at: str, data: dict[str, Any], kind: str = VOTED
    ) -> tuple[str | None, str]:
        """Everything of ``vote_problem`` but the signature itself: the problem, or the
        public key the signature must hold under."""
        record = data.get("signature")
        if not isinstance(record, dict):
            return "its signature is not a signed record", ""
        credential = str(record.get("credential_id", ""))
        registrations = self._by_credential.get(credential)
        if not registrations:
            return f"signed with passkey {credential[:16]}…, which no passkey_added event names", ""
        current = [
            r
            for r in registrations
            if r.added_at <= at and (r.removed_at is None or at < r.removed_at)
        ]
        if not current:
            if all(r.added_at > at for r in registrations):
                return "signed with a passkey registered only after the decision", ""
            return "signed with a passkey removed before the decision", ""
        registration = current[-1]
        person = Actor.parse(actor) if actor else None
        if person is None or not person.id or registration.owner != person.identity:
            return "signed with a passkey registered to someone else", ""
        signed_kind, decision, subject = _signed_subject(kind, chain, data)
        if not statement_matches(
            record, signed_kind, decision=decision, person=person.stored, **subject
        ):
            return "the statement it signs is not this decision", ""
        return None, registration.public_key


def signature_problem(public_key: str, record: dict[str, Any]) -> str | None:
    """Why ``record``'s passkey signature does not hold under ``public_key``, if so."""
    try:
        assertion_verify(
            public_key=public_key,
            record=record,
            rp_id=None,  # the one it names: which host served it is not on the log
            origins=_any_origin,
        )
    except SignatureInvalid as exc:
        return f"its passkey signature does not hold ({exc.reason})"
    return None


def signed_row_break(passkeys: Passkeys, row: EventRow) -> ChainBreak | None:
    """Why the event ``row``, which may be a signed decision, does not hold, if so: its
    content against its hash, then, if it is signed, its passkey and its signature.

    Its link to its chain (seq, ``prev_hash``) is the pass's to check.
    """
    found, data = event_row_content(row)
    if found is not None or not isinstance(data, dict) or "signature" not in data:
        return found
    problem = passkeys.vote_problem(
        chain=row.chain, actor=row.actor, at=row.at, data=data, kind=row.kind
    )
    return None if problem is None else ChainBreak(row.chain, row.seq, problem)


# The passkeys a helper process checks against, given it as it starts.
_helper_passkeys = Passkeys()


def _helper_started(passkeys: Passkeys) -> None:
    global _helper_passkeys
    _helper_passkeys = passkeys


def _rows_checked(rows: list[EventRow]) -> list[ChainBreak | None]:
    """``signed_row_break`` of each row: run in a helper process."""
    return [signed_row_break(_helper_passkeys, row) for row in rows]


# Signed decisions go to the helper processes this many at a time, and at most this many
# batches per helper wait unchecked: beyond, the pass waits for the oldest, so that
# memory holds a few batches whatever the log and its helpers' pace.
BATCH = 256
WAITING_PER_HELPER = 4
# At most this many helpers, one per core.
HELPERS = 4


class EventChecks:
    """The check of each event in a verification's pass: its link to its chain, its hash
    and, for a signed decision, its passkey's signature.

    An event of a kind that may carry a signed decision (``SIGNED_KINDS``) and whose
    text names a signature is checked whole, hash and signature, away from the pass: in
    batches by helper processes (one per core, up to ``HELPERS``) while the pass goes
    on, where the machine has a second core and this process may have children (a
    Celery worker's may not), else here, a batch at a time. The pass checks every
    other event itself, and every event's link. The passkeys are read from the
    database at the first signed decision, never for a log that has none.

    ``row_break`` names the first problem known so far; ``first_break``, at the end of
    the pass (or where it stopped), the first among the events sent away. Both name the
    first in the pass's order: the batches are read in the order they were sent.
    """

    def __init__(self) -> None:
        self._passkeys: Passkeys | None = None
        self._batch: list[EventRow] = []
        self._pending: deque[Future[list[ChainBreak | None]]] = deque()
        self._found: ChainBreak | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._helpers = min(HELPERS, os.cpu_count() or 1)
        self._parallel = self._helpers > 1 and not multiprocessing.current_process().daemon

    def row_break(self, row: EventRow, *, seq: int, prev_hash: str) -> ChainBreak | None:
        """Why ``row`` is not event ``seq`` of its chain linked onto ``prev_hash``, as far
        as is known now: a signed decision's own check may come later (``first_break``)."""
        found = event_row_linked(row, seq=seq, prev_hash=prev_hash)
        if found is not None:
            return found
        if row.kind not in SIGNED_KINDS or SIGNED_MARK not in row.data:
            return event_row_content(row)[0]
        if self._passkeys is None:
            self._passkeys = Passkeys.stored()
        self._batch.append(row)
        if len(self._batch) >= BATCH:
            self._send()
            while self._pending and (
                self._pending[0].done() or len(self._pending) > WAITING_PER_HELPER * self._helpers
            ):
                if self._answered(self._pending.popleft()):
                    return self._found
        return None

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        passkeys = self._passkeys
        assert passkeys is not None, "read at the batch's first signed decision"
        if self._parallel and self._pool is None:
            try:
                self._pool = ProcessPoolExecutor(
                    self._helpers,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=_helper_started,
                    initargs=(passkeys,),
                )
            except (OSError, ValueError):
                self._parallel = False
        if self._pool is not None:
            self._pending.append(self._pool.submit(_rows_checked, batch))
        else:
            done: Future[list[ChainBreak | None]] = Future()
            done.set_result([signed_row_break(passkeys, row) for row in batch])
            self._pending.append(done)

    def _answered(self, batch: Future[list[ChainBreak | None]]) -> bool:
        """Whether a batch's answers name a problem (then ``_found``)."""
        self._found = next((found for found in batch.result() if found is not None), None)
        return self._found is not None

    def first_break(self) -> ChainBreak | None:
        """The first problem among the signed decisions the pass has sent away."""
        if self._found is None and self._batch:
            self._send()
        try:
            while self._found is None and self._pending:
                self._answered(self._pending.popleft())
        finally:
            self._pending.clear()
        return self._found

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
