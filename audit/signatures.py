"""Signed decisions on the audit log, checked against the passkeys the log itself names.

A decision's event that carries a ``signature`` (``approvals.signing``'s record): an
``approval_voted``, a ``reconciliation_approved`` or ``_rejected`` on the operation's
chain, a ``bulk_approved`` or ``_rejected`` on the system chain. It holds when: the
system chain's ``passkey_added`` event for its credential registered it to the event's
actor no later than the decision, and no ``passkey_removed`` event removed it before;
the statement it signs is this decision (``_signed_subject``: its kind, subject,
decision and person); and the passkey's signature over that statement's challenge
verifies under the public key the ``passkey_added`` event recorded.

Nothing here trusts the rows of allauth or the vote: a passkey removed long ago still
verifies the decisions it signed while it was registered, from the log alone. The
same check serves ``verify_audit`` (keys loaded once from the database) and an export
verified offline (keys read from its own system chain's events, ``Passkeys.event``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from approvals.actors import Actor
from approvals.signing import SignatureInvalid, assertion_verify, statement_matches
from audit.hashing import SYSTEM_CHAIN, ChainBreak, EventRow, timestamp
from audit.kinds import AuditKind
from audit.models import AuditEvent

VOTED = AuditKind.APPROVAL_VOTED.value
ADDED = AuditKind.PASSKEY_ADDED.value
REMOVED = AuditKind.PASSKEY_REMOVED.value
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
            {
                "approval_id": data.get("approval_id", ""),
                "operation_key": chain,
                "params_digest": data.get("params_digest", ""),
            },
        )
    decision = "approve" if kind in _APPROVED else "reject"
    if kind in _RECONCILED:
        return (
            "reconciliation",
            decision,
            {
                "request_id": data.get("request_id", ""),
                "operation_key": chain,
                "params_digest": data.get("params_digest", ""),
                "action": data.get("action", ""),
            },
        )
    return (
        "bulk",
        decision,
        {
            "batch_id": data.get("batch", ""),
            "action": data.get("action", ""),
            "items": data.get("items", ""),
            "items_digest": data.get("items_digest", ""),
        },
    )


@dataclass
class _Registration:
    public_key: str
    owner: str  # the user's id, as an actor names it
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
            AuditEvent.objects.filter(operation_key=SYSTEM_CHAIN, kind__in=(ADDED, REMOVED))
            .order_by("id")
            .values_list("kind", "at", "data")
        )
        for kind, at, data in rows.iterator(chunk_size=2000):
            passkeys.event(kind, timestamp(at), data)
        return passkeys

    def event(self, kind: str, at: str, data: dict[str, Any]) -> None:
        """Take in a system chain's ``passkey_added`` or ``passkey_removed`` event."""
        credential = str(data.get("credential_id", ""))
        if kind == ADDED:
            registration = _Registration(
                str(data.get("public_key", "")), str(data.get("user_id", "")), at
            )
            self._by_credential.setdefault(credential, []).append(registration)
        elif kind == REMOVED:
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
        if person is None or person.kind != "user" or registration.owner != person.id:
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


def _signature_problems(items: list[tuple[str, dict[str, Any]]]) -> list[str | None]:
    """``signature_problem`` of each (public key, record): run in a helper process."""
    return [signature_problem(public_key, record) for public_key, record in items]


# Signatures go to the helper processes this many at a time.
BATCH = 256
# At most this many helpers, one per core: on two cores, two helpers beside the pass
# verified a log with 10 % signed votes in 26-29 s where one took 29-32 s (the pass and
# PostgreSQL's backend leave part of the second core and of their own idle).
HELPERS = 4


class SignedVotes:
    """The check of signed votes in a verification's pass over the events.

    The passkeys are read from the database at the first signed vote, never for a log
    that has none; each key is parsed once (``approvals.signing``). The signatures
    themselves, the costly part, are checked in batches by helper processes (one per
    core, up to ``HELPERS``) while the pass goes on hashing, where the machine has a
    second core and this process may have children (a Celery worker's may not):
    ``first_break`` waits for them and reads their answers in the order the batches were
    sent. Elsewhere they are checked here, a batch at a time.
    """

    def __init__(self) -> None:
        self._passkeys: Passkeys | None = None
        self.checked = 0
        self._batch: list[tuple[ChainBreak, str, dict[str, Any]]] = []
        self._pending: list[tuple[list[ChainBreak], Future[list[str | None]]]] = []
        self._pool: ProcessPoolExecutor | None = None
        self._parallel = (os.cpu_count() or 1) > 1 and not multiprocessing.current_process().daemon

    def row_break(self, row: EventRow, parsed: Any = None) -> ChainBreak | None:
        """The problem of ``row`` if it is a signed vote that does not hold, as far as is
        known now: its signature's own check may come later (``first_break``).

        ``parsed``: the row's data already parsed (``event_row_checked``'s), if at hand.
        """
        if row.kind not in SIGNED_KINDS or SIGNED_MARK not in row.data:
            return None
        data = json.loads(row.data) if parsed is None else parsed
        if not isinstance(data, dict) or "signature" not in data:
            return None
        if self._passkeys is None:
            self._passkeys = Passkeys.stored()
        self.checked += 1
        problem, public_key = self._passkeys.vote_precheck(
            chain=row.chain, actor=row.actor, at=row.at, data=data, kind=row.kind
        )
        if problem is not None:
            return ChainBreak(row.chain, row.seq, problem)
        self._batch.append((ChainBreak(row.chain, row.seq, ""), public_key, data["signature"]))
        if len(self._batch) >= BATCH:
            self._send()
        return None

    def _send(self) -> None:
        batch, self._batch = self._batch, []
        where = [place for place, _, _ in batch]
        items = [(public_key, record) for _, public_key, record in batch]
        if self._parallel and self._pool is None:
            try:
                self._pool = ProcessPoolExecutor(
                    min(HELPERS, os.cpu_count() or 1),
                    mp_context=multiprocessing.get_context("fork"),
                )
            except (OSError, ValueError):
                self._parallel = False
        if self._pool is not None:
            self._pending.append((where, self._pool.submit(_signature_problems, items)))
        else:
            done: Future[list[str | None]] = Future()
            done.set_result(_signature_problems(items))
            self._pending.append((where, done))

    def first_break(self) -> ChainBreak | None:
        """The first of the signed votes passed so far whose signature does not hold."""
        if self._batch:
            self._send()
        try:
            for where, problems in self._pending:
                for place, problem in zip(where, problems.result(), strict=True):
                    if problem is not None:
                        return ChainBreak(place.chain, place.seq, problem)
        finally:
            self._pending.clear()
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
