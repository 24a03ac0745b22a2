"""The seven safety rules of docs/design.md, checked on random interleavings (Hypothesis).

A ``RuleBasedStateMachine`` drives the service layer in-process over a handful of
operation keys, so that every kind of step keeps landing on the same operations: hosts
register and ask for approval, approvers approve or deny, workers dispatch (with the right
digest or a wrong one), heartbeat, report (with their own, another operation's or a forged
fencing token, any number of times) and crash (their lease lapses); fresh workers resume
(sometimes holding a stale view of the operation), which dispatches an approved operation,
answers ``in_progress`` while a lease is alive, and otherwise never looks anything up
itself: it queues a lookup for a background worker, whose task runs later (a step of its
own, sometimes twice), and answers from what that lookup settled when asked again; the
provider performs the effect (once, only for a worker that held a dispatch; sometimes for
other parameters or with a "not performed" status), damages and repairs its record, goes
offline and comes back, and sends signed callbacks (right or wrong digest, fresh or stale
sequence numbers); operators look up evidence, and confirm, void or repair (four eyes
where the evidence does not back it: a second operator approves or rejects); approvers
revoke permits; permits expire; the background sweeper (``recovery.services.sweep``,
called directly) moves lapsed leases to unknown and queues due lookups, whose tasks run
the same way.

A small model predicts every answer and every state; invariants named after the rules
compare the database with it after each step. Services refuse requests by raising
``RecoveryError``; any other exception is a bug and fails the test.

``SETTLE_HYPOTHESIS_EXAMPLES`` (default 60) and ``SETTLE_HYPOTHESIS_STEPS`` (default 30)
size the run; ``SETTLE_HYPOTHESIS_SHRINK=0`` skips shrinking a failure.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.functions import Coalesce
from django.test import override_settings
from django.utils import timezone
from guardian.shortcuts import assign_perm
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals.actors import Actor
from approvals.models import Permit, PermitEvent, ReconciliationRequest
from approvals.services.approvers import approver_create
from approvals.services.errors import Refusal
from audit.models import AuditEvent
from audit.verify import audit_verify
from dbsql.clock import db_now
from recovery.models import (
    TERMINAL_STATES,
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    Provider,
    State,
    Verdict,
)
from recovery.permissions import ProviderPermission
from recovery.services.callbacks import CallbackOutcome, provider_callback
from recovery.services.credentials import host_create
from recovery.services.dispatch import (
    ReportOutcome,
    operation_dispatch,
    operation_heartbeat,
    operation_report,
)
from recovery.services.errors import RecoveryError
from recovery.services.four_eyes import reconciliation_approve, reconciliation_reject
from recovery.services.lookup_tasks import lookup_attempt_run
from recovery.services.lookups import operation_lookup
from recovery.services.permits import approval_decision, approval_open, permit_revoke
from recovery.services.providers import provider_configure
from recovery.services.reconcile import operation_reconcile
from recovery.services.registration import operation_register
from recovery.services.resume import LOOKUP_POLL_SECONDS, Decision, operation_resume
from recovery.services.roles import OPERATOR, SUPERVISOR
from recovery.services.sweep import sweep
from tests.support.providers import (
    SQLITE_TAMPER_MODES,
    digest_of,
    sqlite_provider_commit,
    sqlite_provider_init,
    sqlite_provider_tamper,
)

EXAMPLES = int(os.environ.get("SETTLE_HYPOTHESIS_EXAMPLES", "60"))
STEPS = int(os.environ.get("SETTLE_HYPOTHESIS_STEPS", "30"))
# Refusals of one reason on one permit recorded one by one (a run reaches it).
REFUSALS_RECORDED = 2
# Shrinking a failure replays whole examples against the database and can take minutes;
# SETTLE_HYPOTHESIS_SHRINK=0 reports the first failing sequence as found.
SHRINK = os.environ.get("SETTLE_HYPOTHESIS_SHRINK", "1") != "0"

KEYS = ("op-a", "op-b", "op-c")
WORKERS = ("w1", "w2", "w3")
ACTION = "payment.send"
PROVIDER = "orders"
LOOKUP_BUDGET = 3
TTL_SECONDS = 300
FLEET = Actor("host", "1", "fleet-a")
OTHER_PARAMS = {"amount": 1, "currency": "EUR", "to": "acct-mallory"}
TAMPERED_PARAMS = {"tampered": True}  # what sqlite_provider_tamper writes for other_params
BROKEN_DIGEST = "sha256:" + "0" * 64  # what it writes for wrong_stored_digest
# Tokens a host may present that were never handed out, ASCII and not. A non-ASCII token
# must be refused as stale_fencing_token like any other; hmac.compare_digest raises
# TypeError on non-ASCII str, so _dispatch_for_token has to compare bytes (or refuse first).
FORGED_TOKENS = ("forged-token", "", "x" * 64, "tökén-forgé")
# How far each key gets before the random steps start.
HEAD_STARTS = (
    "registered",
    "approved",
    "dispatched",
    "performed",
    "crashed",
    "uncertain",
    "stranded",
    "queued",
    "resumed",
    "escalated",
)
UNREGISTERED_KEY = "op-never-registered"

COMMITTED = "committed"
FAILED_STATUS = "failed"
RUNNING = Dispatch.ReceiptStatus.RUNNING.value
SUCCEEDED = Dispatch.ReceiptStatus.SUCCEEDED.value
RECEIPT_FAILED = Dispatch.ReceiptStatus.FAILED.value

ANSWERS = {
    State.RELEASED: Decision.RELEASED,
    State.UNKNOWN: Decision.UNKNOWN,
    State.RECONCILE: Decision.RECONCILE,
    State.AWAITING_APPROVAL: Decision.WAIT,
    State.DISPATCHED: Decision.IN_PROGRESS,
}


DAMAGE_MODES = [mode for mode in SQLITE_TAMPER_MODES if mode != "huge_created_at"]


def params_for(key: str) -> dict[str, Any]:
    return {"amount": 1000 + KEYS.index(key), "currency": "EUR", "to": f"acct-{key}"}


def answer_for(state: str) -> str:
    return ANSWERS.get(State(state), Decision.CLOSED)


# --------------------------------------------------------------------------- the model


@dataclass
class Record:
    """The provider's orders + receipts rows for one key, as the model believes them."""

    params: dict[str, Any]
    status: str
    reference: str
    order_status: str | None  # None: no order row
    receipt: tuple[str | None, str] | None  # (digest of params_json or None, stored digest)

    @classmethod
    def performed(cls, params: dict[str, Any], status: str, reference: str) -> Record:
        digest = digest_of(params)
        return cls(params, status, reference, status, (digest, digest))

    @property
    def damaged(self) -> bool:
        digest = digest_of(self.params)
        return self.order_status != self.status or self.receipt != (digest, digest)

    def verdict(self, expected_digest: str) -> tuple[str, str]:
        """What ``evidence_lookup`` must say about these rows: (verdict, provider_status)."""
        if self.order_status is None and self.receipt is None:
            return Verdict.ABSENT, ""
        if self.order_status is None or self.receipt is None:
            return Verdict.CORRUPT, ""
        if self.order_status not in (COMMITTED, FAILED_STATUS):
            return Verdict.CORRUPT, ""
        json_digest, stored = self.receipt
        if json_digest is None or json_digest != stored:
            return Verdict.CORRUPT, ""
        if stored != expected_digest:
            return Verdict.MISMATCH, self.order_status
        return Verdict.MATCH, self.order_status

    def tamper(self, mode: str) -> bool:
        """Apply ``mode`` to the model; False if the provider has no row to damage."""
        needs_order = mode in ("delete_order", "bad_status")
        if (self.order_status is None) if needs_order else (self.receipt is None):
            return False
        if mode == "delete_receipt":
            self.receipt = None
        elif mode == "delete_order":
            self.order_status = None
        elif mode == "bad_status":
            self.order_status = "pending"
        else:
            assert self.receipt is not None
            json_digest, stored = self.receipt
            if mode == "bad_json":
                self.receipt = (None, stored)
            elif mode == "wrong_stored_digest":
                self.receipt = (json_digest, BROKEN_DIGEST)
            else:  # other_params
                other = digest_of(TAMPERED_PARAMS)
                self.receipt = (other, other)
        return True


@dataclass
class OpModel:
    """What the model expects of one operation key."""

    key: str
    params: dict[str, Any]
    digest: str
    registered: bool = False
    state: str = ""
    version: int = 0
    recovered: bool = False
    history: list[str] = field(default_factory=list)
    pending_approval: uuid.UUID | None = None
    decided_approvals: list[uuid.UUID] = field(default_factory=list)
    permit_id: uuid.UUID | None = None
    permit_status: str | None = None
    permit_past_expiry: bool = False
    permit_was_consumed: bool = False
    token: str | None = None
    tokens_issued: int = 0
    worker_alive: bool = False
    lease_lapsed: bool = False
    receipt: str | None = None
    receipt_recovered: bool = False
    record: Record | None = None
    effects: int = 0
    inconclusive: int = 0
    last_sequence: int | None = None
    evidence: list[tuple[str, str]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # lines of the permit's history
    # Refusals past REFUSALS_RECORDED of a reason, counted in its summary line.
    counted: Counter[str] = field(default_factory=Counter)
    consume_refused: int = 0  # audit events: every refusal without a permit, and each line
    release_cause: str = ""
    lookup_queued: int | None = None  # the attempt waiting for its task (one at most)
    lookup_trigger: str = ""  # who queued it: the sweeper ("task") or resume ("resume")
    lookups_run: list[int] = field(default_factory=list)  # background attempts done

    def move(self, to: str) -> None:
        self.state = to
        self.version += 1
        self.history.append(to)


class Refused:
    """Expect ``RecoveryError`` with ``code`` from the block; anything else propagates."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __enter__(self) -> Refused:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        assert kind is not None, f"expected a {self.code!r} refusal, the call succeeded"
        if not issubclass(kind, RecoveryError):
            return False  # not a refusal: a bug, let it fail the test
        assert value.code == self.code, f"expected {self.code!r}, got {value.code!r}"
        return True


@dataclass
class Facts:
    """One read of the database (and the provider's file) after a step."""

    operations: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    permits: dict[uuid.UUID, tuple[str, str, str]] = field(default_factory=dict)
    dispatches: list[tuple[str, uuid.UUID]] = field(default_factory=list)
    receipts: dict[str, tuple[str, bool, int | None]] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counted: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    consumed: Counter[uuid.UUID] = field(default_factory=Counter)
    events: list[tuple[int, str, str, Any, str]] = field(default_factory=list)
    kinds: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    transitions: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    committed_reports: Counter[str] = field(default_factory=Counter)
    evidence: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    provider_rows: Counter[tuple[str, str]] = field(default_factory=Counter)


def step(method: Callable[..., None]) -> Callable[..., None]:
    """Mark a rule as changing the world: the invariants read the database afresh."""

    @functools.wraps(method)
    def wrapper(self: SafetyMachine, *args: Any, **kwargs: Any) -> None:
        self._facts_cache = None
        method(self, *args, **kwargs)
        self._facts_cache = None

    return wrapper


# --------------------------------------------------------------------------- the machine


def _console_user(
    name: str, permissions: tuple[ProviderPermission, ...], provider: Provider
) -> Actor:
    """A console user holding ``permissions`` on ``provider`` (not granted through the
    audited grant service: the machine counts every audit event it expects)."""
    user = get_user_model().objects.create_user(username=name)
    for permission in permissions:
        assign_perm(permission.perm, user, provider)
    return Actor.of("user", user)


class SafetyMachine(RuleBasedStateMachine):
    """Random interleavings of everything hosts, workers, providers and people do."""

    def __init__(self) -> None:
        super().__init__()
        # Each example runs in a savepoint that teardown() rolls back: the database starts
        # empty every time (AuditEvent rows cannot be deleted on PostgreSQL).
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self._tmp = Path(tempfile.mkdtemp(prefix="settle-props-"))
        try:
            assert not Operation.objects.exists()
            assert not AuditEvent.objects.exists()
            assert not Permit.objects.exists()
            self.provider_path = self._tmp / "orders.sqlite3"
            self.down_path = self._tmp / "orders.sqlite3.offline"
            sqlite_provider_init(self.provider_path)
            self.provider, _ = provider_configure(
                name=PROVIDER,
                adapter="sqlite",
                path=str(self.provider_path),
                lease_seconds=60,
                timeout_seconds=2,
            )
            Provider.objects.filter(pk=self.provider.pk).update(lookup_budget=LOOKUP_BUDGET)
            self.host, _ = host_create(name="fleet-a")
            self.other_host, _ = host_create(name="fleet-b")
            # The services check who acts: an operator and a supervisor of the provider.
            self.olivia = _console_user("olivia", OPERATOR, self.provider)
            self.sam = _console_user("sam", SUPERVISOR, self.provider)
            # Two approvers' phones, for every provider (their scope is the service's rule).
            self.alice = Actor.of("approver", approver_create(name="alice", all_providers=True)[0])
            self.bob = Actor.of("approver", approver_create(name="bob", all_providers=True)[0])
        except BaseException:
            self.teardown()
            raise
        self.ops = {key: OpModel(key, params_for(key), digest_of(params_for(key))) for key in KEYS}
        self.provider_down = False
        self.views: dict[str, Operation] = {}  # a worker's earlier read of an operation
        self.seen: dict[str, tuple[str, int]] = {}
        self.audit_count = 0
        self.audit_tip: tuple[int, str] | None = None
        self._facts_cache: Facts | None = None

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------

    def _registered(self) -> list[str]:
        return [key for key in KEYS if self.ops[key].registered]

    def _draw_key(self, data: st.DataObject, keys: list[str]) -> str:
        return data.draw(st.sampled_from(keys), label="key")

    def _op(self, key: str) -> Operation:
        return Operation.objects.select_related("provider").get(key=key)

    def _provider_file(self) -> Path:
        return self.down_path if self.provider_down else self.provider_path

    def _hand_token(self, m: OpModel, token: str) -> None:
        assert token
        m.token = token
        m.tokens_issued += 1
        m.worker_alive = True
        m.lease_lapsed = False
        m.receipt = RUNNING

    def _model_consume(self, m: OpModel, right_digest: bool) -> str:
        """Predict ``operation_dispatch``; returns the refusal reason, "" on dispatch."""
        if m.permit_status is None:
            refusal = Refusal.NOT_AUTHORIZED
        elif m.permit_status == Permit.Status.CONSUMED:
            refusal = Refusal.ALREADY_CONSUMED
        elif m.permit_status == Permit.Status.REVOKED:
            refusal = Refusal.REVOKED
        elif not right_digest:
            refusal = Refusal.ACTION_MISMATCH
        elif m.permit_status == Permit.Status.EXPIRED or m.permit_past_expiry:
            m.permit_status = Permit.Status.EXPIRED
            refusal = Refusal.EXPIRED
        else:
            refusal = ""
        if refusal:
            if m.permit_status is None:
                m.consume_refused += 1
            elif m.refusals.count(refusal) < REFUSALS_RECORDED:
                m.consume_refused += 1
                m.refusals.append(refusal)  # a line of its own
            else:
                if not m.counted[refusal]:
                    m.consume_refused += 1
                    m.refusals.append(refusal)  # the summary line, opened
                m.counted[refusal] += 1
            if refusal == Refusal.EXPIRED and m.state == State.APPROVED:
                m.move(State.EXPIRED)
            return refusal
        assert m.state == State.APPROVED, f"model: an active permit while {m.state}"
        m.permit_status = Permit.Status.CONSUMED
        m.permit_was_consumed = True
        m.move(State.DISPATCHED)
        return ""

    def _model_evidence(self, m: OpModel, verdict: str, status: str, source: str) -> None:
        """Predict ``_evidence_judge`` (rules 4 and 5)."""
        m.evidence.append((verdict, status))
        committed = verdict == Verdict.MATCH and status == COMMITTED
        not_performed = verdict == Verdict.MATCH and status == FAILED_STATUS
        if m.state == State.FAILED and committed:
            m.move(State.RECONCILE)
            return
        if m.state not in (State.DISPATCHED, State.UNKNOWN, State.RECONCILE):
            return
        if committed or not_performed:
            contradicts = (committed and m.receipt == RECEIPT_FAILED) or (
                not_performed and m.receipt == SUCCEEDED
            )
            if contradicts:
                if m.state != State.RECONCILE:
                    m.move(State.RECONCILE)
                return
            m.move(State.RELEASED if committed else State.FAILED)
            m.recovered = True
            if committed:
                m.release_cause = f"evidence:{source}"
            if m.receipt == RUNNING:
                m.receipt = SUCCEEDED if committed else RECEIPT_FAILED
                m.receipt_recovered = True
            return
        if verdict in (Verdict.MISMATCH, Verdict.CORRUPT):
            if m.state != State.RECONCILE:
                m.move(State.RECONCILE)
            return
        if m.state == State.UNKNOWN:  # absent / unavailable: inconclusive
            m.inconclusive += 1
            if m.inconclusive >= LOOKUP_BUDGET:
                m.move(State.RECONCILE)

    def _model_lookup(self, m: OpModel) -> None:
        if self.provider_down:
            verdict, status = Verdict.UNAVAILABLE.value, ""
        elif m.record is None:
            verdict, status = Verdict.ABSENT.value, ""
        else:
            verdict, status = m.record.verdict(m.digest)
        self._model_evidence(m, verdict, status, "lookup")

    def _model_resume(self, m: OpModel, due: bool) -> tuple[str, str, str]:
        """Predict ``operation_resume``, which judges the operation as it is under its lock.

        ``due``: whether the operation's next lookup was due when resume was called.
        Returns the decision, the state, and what the host is told to wait for: "" (no
        ``retry_after``), "lease" (a live dispatch), "lookup" (a lookup is queued: this
        call's, or one queued before) or "schedule" (the next lookup is not due).
        """
        if m.state == State.APPROVED:
            if not self._model_consume(m, right_digest=True):
                return Decision.DISPATCH, m.state, ""
            return answer_for(m.state), m.state, ""
        if m.state == State.DISPATCHED:
            if not m.lease_lapsed:
                return Decision.IN_PROGRESS, m.state, "lease"
            m.move(State.UNKNOWN)
            due = True  # a lost lease makes the first lookup due at once
        if m.state not in (State.UNKNOWN, State.RECONCILE):
            return answer_for(m.state), m.state, ""
        if not due:
            return answer_for(m.state), m.state, "schedule"
        return Decision.IN_PROGRESS, m.state, "lookup"

    def _attempt_runs(self, m: OpModel) -> bool:
        """Whether a background worker runs ``m``'s queued attempt now, or abandons it.

        The sweeper's lookups are for unknown operations only; resume's for any unsettled
        one, since resume looks at an operation in reconcile again once it is due (its
        record may have been repaired: ``RECONCILE_RECHECK``).
        """
        if m.lookup_trigger == LookupAttempt.Trigger.RESUME:
            return m.state in (State.UNKNOWN, State.RECONCILE)
        return m.state == State.UNKNOWN

    # -- hosts and approvers --------------------------------------------------------

    @initialize(stages=st.tuples(*[st.sampled_from(HEAD_STARTS)] * len(KEYS)))
    @step
    def head_start(self, stages: tuple[str, ...]) -> None:
        """Register every key and bring each one some way along, so steps interact."""
        for key, stage in zip(KEYS, stages, strict=True):
            m = self.ops[key]
            self.register(key, "same")
            if stage == "registered":
                continue
            self._approve(m, "approve")
            if stage == "approved":
                continue
            self._dispatch(m, WORKERS[KEYS.index(key)], "right")
            if stage in ("performed", "escalated"):
                self._perform(m, "committed")
            if stage == "escalated":  # the provider's record of it no longer matches
                self._damage(m, "other_params")
            if stage in ("crashed", "uncertain", "stranded", "queued", "resumed", "escalated"):
                self._crash(m)
            if stage == "queued":  # the sweeper found it; its lookup waits for a worker
                self.background_sweep(time_passed=False)
                assert m.lookup_queued is not None
            if stage in ("uncertain", "stranded", "resumed", "escalated"):
                # A fresh worker resumed it: its lookup is queued ("resumed": and waits).
                self._resume(m, "w-fresh", stale_view=False, time_passed=True)
                assert m.state == State.UNKNOWN and m.lookup_queued is not None
            if stage in ("uncertain", "stranded", "escalated"):  # a worker ran the lookup
                self._background_lookup(m)
            if stage in ("uncertain", "stranded"):  # and found nothing
                assert m.state == State.UNKNOWN and m.inconclusive == 1
            if stage == "escalated":  # and found a mismatch, for an operator
                assert m.state == State.RECONCILE
            if stage == "stranded":  # the dead worker's request reaches the provider late
                self._perform(m, "committed")

    @rule(key=st.sampled_from(KEYS), variant=st.sampled_from(["same", "same", "params", "host"]))
    @step
    def register(self, key: str, variant: str) -> None:
        m = self.ops[key]
        if not m.registered:
            variant = "same"
        host = self.other_host if variant == "host" else self.host
        params = OTHER_PARAMS if variant == "params" else m.params

        def call() -> tuple[Operation, bool]:
            return operation_register(
                host=host, key=key, action=ACTION, provider_name=PROVIDER, params=params
            )

        if variant != "same":
            with Refused("key_conflict"):
                call()
            return
        operation, created = call()
        assert created == (not m.registered)
        assert operation.params_digest == m.digest
        if created:
            m.registered = True
            m.state, m.version = State.AWAITING_APPROVAL.value, 1
            m.history.append(m.state)
        assert (operation.state, operation.version) == (m.state, m.version)

    @precondition(lambda self: self._registered())
    @rule(
        data=st.data(),
        decision=st.sampled_from(["approve", "approve", "approve", "deny", "leave_pending"]),
    )
    @step
    def approve(self, data: st.DataObject, decision: str) -> None:
        self._approve(self.ops[self._draw_key(data, self._registered())], decision)

    def _approve(self, m: OpModel, decision: str) -> None:
        operation = self._op(m.key)
        if m.state != State.AWAITING_APPROVAL:
            with Refused("invalid_state"):
                approval_open(operation=operation, host=self.host)
            return
        approval, created = approval_open(operation=operation, host=self.host)
        assert created == (m.pending_approval is None)
        assert created or approval.id == m.pending_approval
        assert approval.params_digest == m.digest
        m.pending_approval = approval.id
        if decision == "leave_pending":
            return
        approve = decision == "approve"
        approval, permit = approval_decision(
            approval_id=approval.id,
            approve=approve,
            ttl_seconds=TTL_SECONDS,
            decided_by=self.alice,
            reviewed_digest=m.digest,
        )
        m.pending_approval = None
        m.decided_approvals.append(approval.id)
        if approve:
            assert permit is not None and permit.status == Permit.Status.ACTIVE
            assert permit.params_digest == m.digest and permit.operation_key == m.key
            m.permit_id, m.permit_status = permit.id, permit.status
            m.move(State.APPROVED)
        else:
            assert permit is None
            m.move(State.DENIED)

    @precondition(lambda self: any(m.decided_approvals for m in self.ops.values()))
    @rule(data=st.data(), approve=st.booleans())
    @step
    def decide_again(self, data: st.DataObject, approve: bool) -> None:
        m = self.ops[self._draw_key(data, [k for k in KEYS if self.ops[k].decided_approvals])]
        approval_id = data.draw(st.sampled_from(m.decided_approvals), label="approval")
        with Refused("already_decided"):
            approval_decision(
                approval_id=approval_id,
                approve=approve,
                ttl_seconds=TTL_SECONDS,
                decided_by=self.bob,
                reviewed_digest=m.digest,
            )

    @precondition(lambda self: any(m.permit_id for m in self.ops.values()))
    @rule(data=st.data(), unknown=st.sampled_from([False, False, False, True]))
    @step
    def revoke(self, data: st.DataObject, unknown: bool) -> None:
        if unknown:
            with Refused("unknown_permit"):
                permit_revoke(permit_id=uuid.uuid4(), reason="typo", actor=self.alice)
            return
        m = self.ops[self._draw_key(data, [k for k in KEYS if self.ops[k].permit_id])]
        assert m.permit_id is not None
        permit, revoked = permit_revoke(
            permit_id=m.permit_id, reason="customer changed their mind", actor=self.alice
        )
        assert revoked == (m.permit_status == Permit.Status.ACTIVE)
        if revoked:
            m.permit_status = Permit.Status.REVOKED
            if m.state == State.APPROVED:
                m.move(State.REVOKED)
        assert permit.status == m.permit_status

    @precondition(
        lambda self: any(m.permit_id and not m.permit_past_expiry for m in self.ops.values())
    )
    @rule(data=st.data())
    @step
    def expire(self, data: st.DataObject) -> None:
        keys = [k for k in KEYS if self.ops[k].permit_id and not self.ops[k].permit_past_expiry]
        m = self.ops[self._draw_key(data, keys)]
        permit = Permit.objects.get(pk=m.permit_id)
        expires_at = permit.issued_at + timedelta(microseconds=1)
        Permit.objects.filter(pk=permit.pk).update(expires_at=expires_at)
        # The database clock judges expiry (SQLite's to the millisecond): make it past.
        while db_now() - expires_at < timedelta(milliseconds=3):
            time.sleep(0.002)
        m.permit_past_expiry = True

    # -- workers --------------------------------------------------------------------

    @precondition(lambda self: self._registered())
    @rule(
        data=st.data(),
        worker=st.sampled_from(WORKERS),
        digest=st.sampled_from(["right", "right", "right", "other_params", "other_key"]),
    )
    @step
    def dispatch(self, data: st.DataObject, worker: str, digest: str) -> None:
        self._dispatch(self.ops[self._draw_key(data, self._registered())], worker, digest)

    def _dispatch(self, m: OpModel, worker: str, digest: str) -> None:
        presented = {
            "right": m.digest,
            "other_params": digest_of(OTHER_PARAMS),
            "other_key": digest_of(params_for(next(k for k in KEYS if k != m.key))),
        }[digest]
        if m.key not in self.views:
            self.views[m.key] = self._op(m.key)
        outcome = operation_dispatch(
            operation=self._op(m.key),
            worker=worker,
            presented_digest=presented,
            actor=FLEET,
        )
        expected = self._model_consume(m, right_digest=digest == "right")
        assert outcome.refusal == expected
        assert outcome.state == m.state
        if expected:
            assert outcome.dispatch is None
        else:
            assert outcome.dispatch is not None and outcome.dispatch.worker == worker
            self._hand_token(m, outcome.dispatch.fencing_token)

    @precondition(lambda self: any(m.token and m.worker_alive for m in self.ops.values()))
    @rule(data=st.data())
    @step
    def crash(self, data: st.DataObject) -> None:
        keys = [k for k in KEYS if self.ops[k].token and self.ops[k].worker_alive]
        self._crash(self.ops[self._draw_key(data, keys)])

    def _crash(self, m: OpModel) -> None:
        """The worker dies holding the dispatch: nobody renews its lease any more."""
        changed = Dispatch.objects.filter(operation__key=m.key).update(
            lease_expires_at=db_now() - timedelta(hours=1)
        )
        assert changed == 1
        m.worker_alive = False
        m.lease_lapsed = True

    @precondition(lambda self: any(m.token and m.worker_alive for m in self.ops.values()))
    @rule(data=st.data(), forged=st.sampled_from([False, False, False, True]))
    @step
    def heartbeat(self, data: st.DataObject, forged: bool) -> None:
        keys = [k for k in KEYS if self.ops[k].token and self.ops[k].worker_alive]
        m = self.ops[self._draw_key(data, keys)]
        token = data.draw(st.sampled_from(FORGED_TOKENS)) if forged else m.token
        assert token is not None

        def call() -> Dispatch:
            return operation_heartbeat(operation=self._op(m.key), fencing_token=token, actor=FLEET)

        if forged:
            with Refused("stale_fencing_token"):
                call()
        elif m.state != State.DISPATCHED:
            with Refused("lease_lost"):
                call()
        else:
            call()
            m.lease_lapsed = False

    @precondition(lambda self: self._registered())
    @rule(
        data=st.data(),
        token_kind=st.sampled_from(["own", "own", "own", "other_op", "forged"]),
        outcome=st.sampled_from([COMMITTED, COMMITTED, FAILED_STATUS]),
    )
    @step
    def report(self, data: st.DataObject, token_kind: str, outcome: str) -> None:
        m = self.ops[self._draw_key(data, self._registered())]
        others = [self.ops[k].token for k in KEYS if k != m.key and self.ops[k].token]
        if token_kind == "own" and m.token:
            token = m.token
        elif token_kind == "other_op" and others:
            token = data.draw(st.sampled_from(others), label="other token")
        else:
            token = data.draw(st.sampled_from(FORGED_TOKENS), label="forged token")

        def call() -> ReportOutcome:
            return operation_report(
                operation=self._op(m.key),
                fencing_token=token,
                outcome=outcome,
                provider_reference=f"ref-{m.key}",
                actor=FLEET,
            )

        if m.token is None or token != m.token:
            with Refused("stale_fencing_token"):
                call()
            return
        result = call()
        if m.receipt != RUNNING:
            expected = (False, m.state, m.receipt)
        else:
            m.receipt = SUCCEEDED if outcome == COMMITTED else RECEIPT_FAILED
            if m.state == State.DISPATCHED:
                m.move(State.RELEASED if outcome == COMMITTED else State.FAILED)
                if outcome == COMMITTED:
                    m.release_cause = "host_commit"
            expected = (True, m.state, m.receipt)
        assert (result.applied, result.state, result.receipt_status) == expected

    @precondition(lambda self: self._registered())
    @rule(
        data=st.data(),
        worker=st.sampled_from(WORKERS),
        stale_view=st.sampled_from([False, False, True]),
        time_passed=st.sampled_from([False, True, True]),
        poll=st.booleans(),
    )
    @step
    def resume(
        self, data: st.DataObject, worker: str, stale_view: bool, time_passed: bool, poll: bool
    ) -> None:
        """A fresh worker resumes; with ``poll``, a host that waits for a queued lookup.

        Told ``in_progress`` while a lookup is queued, it asks again after ``retry_after``;
        by then a background worker has run that lookup, and resume answers from it.
        """
        m = self.ops[self._draw_key(data, self._registered())]
        self._resume(m, worker, stale_view, time_passed)
        if poll and m.lookup_queued is not None:
            self._background_lookup(m)
            self._resume(m, worker, stale_view=False, time_passed=False)

    def _resume(self, m: OpModel, worker: str, stale_view: bool, time_passed: bool) -> None:
        """A fresh worker asks what to do, holding a fresh read or one taken steps ago.

        Resume reads the operation afresh under its lock: a stale view changes nothing.
        With ``time_passed`` the operation's next lookup has come due; otherwise resume
        must respect the schedule the system set (and queue a lookup only if it is due).
        """
        if time_passed:
            Operation.objects.filter(key=m.key).update(
                next_lookup_at=timezone.now() - timedelta(seconds=1)
            )
        now = timezone.now()
        scheduled = Operation.objects.get(key=m.key).next_lookup_at
        due = scheduled is None or scheduled <= now
        view = self.views.pop(m.key, None) if stale_view else None
        if view is None:
            view = self._op(m.key)
            if m.key not in self.views:
                self.views[m.key] = self._op(m.key)
        outcome = operation_resume(operation=view, worker=worker, actor=FLEET)
        decision, state, wait = self._model_resume(m, due)
        assert (outcome.decision, outcome.state) == (decision, state)
        if wait == "lease":
            assert 1 <= outcome.retry_after <= self.provider.lease_seconds, outcome
        elif wait == "lookup":
            assert outcome.retry_after == LOOKUP_POLL_SECONDS, outcome
            if m.lookup_queued is None:  # this call queued it, for a background worker
                attempt = LookupAttempt.objects.get(operation__key=m.key, status="queued")
                assert attempt.trigger == LookupAttempt.Trigger.RESUME
                m.lookup_queued, m.lookup_trigger = attempt.pk, attempt.trigger
        elif wait == "schedule":  # until the next lookup is due
            assert scheduled is not None
            until = math.ceil((scheduled - now).total_seconds())
            assert 1 <= outcome.retry_after <= until, (outcome, until)
        else:
            assert outcome.retry_after == 0, outcome
        if decision == Decision.DISPATCH:
            self._hand_token(m, outcome.fencing_token)
        else:
            assert outcome.fencing_token == ""
        assert outcome.recovered is m.recovered

    # -- the provider and the operators ---------------------------------------------

    @precondition(
        lambda self: (
            not self.provider_down and any(m.token and not m.effects for m in self.ops.values())
        )
    )
    @rule(
        data=st.data(),
        kind=st.sampled_from(["committed", "committed", "committed", "failed", "other_params"]),
    )
    @step
    def provider_performs(self, data: st.DataObject, kind: str) -> None:
        """The worker holding the dispatch reached the provider: one effect, ever."""
        keys = [k for k in KEYS if self.ops[k].token and not self.ops[k].effects]
        self._perform(self.ops[self._draw_key(data, keys)], kind)

    def _perform(self, m: OpModel, kind: str) -> None:
        params = OTHER_PARAMS if kind == "other_params" else m.params
        status = FAILED_STATUS if kind == "failed" else COMMITTED
        reference = f"ord-{m.key}"
        sqlite_provider_commit(
            self.provider_path,
            operation_key=m.key,
            params=params,
            reference=reference,
            status=status,
            replace=False,
        )
        m.effects += 1
        m.record = Record.performed(params, status, reference)

    @precondition(lambda self: not self.provider_down and any(m.record for m in self.ops.values()))
    # The model's record knows the damage that changes a verdict; an out-of-range
    # created_at is tested on its own (test_adapters, test_evidence_rules).
    @rule(data=st.data(), mode=st.sampled_from(DAMAGE_MODES))
    @step
    def provider_record_damaged(self, data: st.DataObject, mode: str) -> None:
        self._damage(self.ops[self._draw_key(data, [k for k in KEYS if self.ops[k].record])], mode)

    def _damage(self, m: OpModel, mode: str) -> None:
        assert m.record is not None
        if m.record.tamper(mode):
            sqlite_provider_tamper(self.provider_path, m.key, mode)

    @precondition(
        lambda self: (
            not self.provider_down and any(m.record and m.record.damaged for m in self.ops.values())
        )
    )
    @rule(data=st.data())
    @step
    def provider_record_repaired(self, data: st.DataObject) -> None:
        """The provider restores the record of the one effect it performed (not a new one)."""
        keys = [k for k in KEYS if (r := self.ops[k].record) is not None and r.damaged]
        m = self.ops[self._draw_key(data, keys)]
        assert m.record is not None
        record = m.record
        sqlite_provider_commit(
            self.provider_path,
            operation_key=m.key,
            params=record.params,
            reference=record.reference,
            status=record.status,
        )
        m.record = Record.performed(record.params, record.status, record.reference)

    @precondition(lambda self: not self.provider_down)
    @rule()
    @step
    def provider_goes_offline(self) -> None:
        self.provider_path.rename(self.down_path)
        self.provider_down = True

    @precondition(lambda self: self.provider_down)
    @rule()
    @step
    def provider_comes_back(self) -> None:
        self.down_path.rename(self.provider_path)
        self.provider_down = False

    @precondition(lambda self: self._registered())
    @rule(data=st.data())
    @step
    def lookup(self, data: st.DataObject) -> None:
        m = self.ops[self._draw_key(data, self._registered())]
        operation = operation_lookup(
            operation=self._op(m.key), trigger="operator", actor=self.olivia
        )
        if m.lookup_queued is None:  # else: one lookup at a time, the queued one first
            self._model_lookup(m)
        assert (operation.state, operation.version) == (m.state, m.version)

    @precondition(lambda self: self._registered())
    @rule(
        data=st.data(),
        action=st.sampled_from(["confirm", "void", "repair"]),
        second=st.sampled_from(["approve", "approve", "reject", "self"]),
        stale_page=st.sampled_from([False, False, False, True]),
    )
    @step
    def operator_decides(
        self, data: st.DataObject, action: str, second: str, stale_page: bool
    ) -> None:
        """An operator confirms, voids or repairs; four eyes where the evidence does not back it.

        ``second``: what a second operator does with a proposal (approve it, reject it),
        or ``self``: the proposer, a supervisor who may approve proposals, tries to approve
        their own, is refused, and it is rejected.
        """
        m = self.ops[self._draw_key(data, self._registered())]
        proposer = self.sam if second == "self" else self.olivia
        latest = m.evidence[-1] if m.evidence else None
        committed = latest == (Verdict.MATCH, COMMITTED)
        not_performed = latest == (Verdict.MATCH, FAILED_STATUS)  # absence is not authoritative

        def decide() -> Any:
            return operation_reconcile(
                operation=self._op(m.key),
                action=action,
                version=m.version - 1 if stale_page else m.version,
                reason="checked by hand",
                actor=proposer,
            )

        if stale_page:
            refusal = "stale_version"
        elif action == "repair":
            settled = m.state in (State.RELEASED, State.FAILED, State.VOIDED)
            refusal = "" if m.receipt == RUNNING and settled else "not_stranded"
            backed = committed if m.state == State.RELEASED else not_performed
        elif m.state not in (State.UNKNOWN, State.RECONCILE):
            refusal = "not_allowed"
        elif action == "void" and committed:
            refusal = "evidence_matches"
        else:
            refusal = ""
            backed = committed if action == "confirm" else not_performed
        if refusal:
            with Refused(refusal):
                decide()
            return
        decided = decide()
        if backed:
            assert decided.request is None
            self._model_decision(m, action)
            return
        request = decided.request
        assert request is not None and request.status == "pending"
        if second == "self":
            with Refused("self_approval"):
                reconciliation_approve(
                    operation=self._op(m.key),
                    request_id=request.pk,
                    reason="mine",
                    actor=proposer,
                )
        if second in ("self", "reject"):
            reconciliation_reject(
                operation=self._op(m.key), request_id=request.pk, reason="no", actor=self.sam
            )
            return
        reconciliation_approve(
            operation=self._op(m.key), request_id=request.pk, reason="agreed", actor=self.sam
        )
        self._model_decision(m, action)

    def _model_decision(self, m: OpModel, action: str) -> None:
        """Predict an operator's decision taken (directly, or approved by a second one)."""
        if action == "confirm":
            m.move(State.RELEASED)
            m.release_cause = "operator:confirm"
        elif action == "void":
            m.move(State.VOIDED)
        if m.receipt == RUNNING:
            m.receipt = SUCCEEDED if m.state == State.RELEASED else RECEIPT_FAILED
            m.receipt_recovered = True

    @rule(time_passed=st.sampled_from([False, True, True]))
    @step
    def background_sweep(self, time_passed: bool) -> None:
        """Beat's sweep: lapsed leases to unknown, then a lookup queued for each due one.

        With ``time_passed`` the back-off of every unknown operation has run out.
        """
        now = timezone.now()
        if time_passed:
            Operation.objects.filter(state=State.UNKNOWN).update(
                next_lookup_at=now - timedelta(seconds=1)
            )
        scheduled = dict(Operation.objects.values_list("key", "next_lookup_at"))
        expected_lapsed, expected_queued = set(), set()
        for key, m in self.ops.items():
            if m.state == State.DISPATCHED and m.lease_lapsed:
                m.move(State.UNKNOWN)
                expected_lapsed.add(key)
                scheduled[key] = None  # due at once
            due = scheduled.get(key) is None or scheduled[key] <= now
            if m.state == State.UNKNOWN and due and m.lookup_queued is None:
                expected_queued.add(key)
        published: list[int] = []
        report = sweep(publish=published.append)
        assert published == report.lookups_queued
        keys = dict(Operation.objects.values_list("pk", "key"))
        assert {keys[pk] for pk in report.leases_lapsed} == expected_lapsed
        queued = dict(
            LookupAttempt.objects.filter(pk__in=published).values_list("operation__key", "pk")
        )
        assert set(queued) == expected_queued and len(published) == len(queued)
        for key, attempt_id in queued.items():
            self.ops[key].lookup_queued = attempt_id
            self.ops[key].lookup_trigger = LookupAttempt.Trigger.TASK

    @precondition(lambda self: any(m.lookup_queued for m in self.ops.values()))
    @rule(data=st.data())
    @step
    def background_lookup(self, data: st.DataObject) -> None:
        """A Celery worker runs a queued lookup, the sweeper's or one a resume queued."""
        keys = [k for k in KEYS if self.ops[k].lookup_queued]
        self._background_lookup(self.ops[self._draw_key(data, keys)])

    def _background_lookup(self, m: OpModel) -> None:
        """Run ``m``'s queued attempt as its task does: a lookup, or abandoned if out of date."""
        assert m.lookup_queued is not None
        outcome = lookup_attempt_run(attempt_id=m.lookup_queued)
        runs = self._attempt_runs(m)
        if runs:
            self._model_lookup(m)
        assert (outcome.looked_up, outcome.state, outcome.retry_in) == (runs, m.state, 0)
        m.lookups_run.append(m.lookup_queued)
        m.lookup_queued = None
        m.lookup_trigger = ""

    @precondition(lambda self: any(m.lookups_run for m in self.ops.values()))
    @rule(data=st.data())
    @step
    def background_lookup_redelivered(self, data: st.DataObject) -> None:
        """The broker delivers a finished lookup's message again: nothing changes."""
        m = self.ops[self._draw_key(data, [k for k in KEYS if self.ops[k].lookups_run])]
        attempt_id = data.draw(st.sampled_from(m.lookups_run), label="attempt")
        outcome = lookup_attempt_run(attempt_id=attempt_id)
        assert (outcome.looked_up, outcome.state) == (False, m.state)

    @rule(
        key=st.sampled_from([*KEYS, *KEYS, UNREGISTERED_KEY]),
        status=st.sampled_from([COMMITTED, COMMITTED, FAILED_STATUS]),
        right_digest=st.sampled_from([True, True, False]),
        sequence=st.sampled_from(["next", "next", "jump", "same", "older"]),
    )
    @step
    def provider_callback(self, key: str, status: str, right_digest: bool, sequence: str) -> None:
        """A signed provider notification (the signature is checked by the API layer)."""
        m = self.ops.get(key)
        last = m.last_sequence if m is not None else None
        base = last if last is not None else 0
        seq = {"next": base + 1, "jump": base + 5, "same": base, "older": base - 1}[sequence]

        def call() -> CallbackOutcome:
            return provider_callback(
                provider=self.provider,
                operation_key=key,
                status=status,
                params_digest=m.digest if m and right_digest else digest_of(OTHER_PARAMS),
                reference=f"cb-{key}-{seq}",
                sequence=seq,
                raw={"sequence": seq, "status": status, "operation_key": key},
            )

        if m is None or not m.registered:
            with Refused("unknown_operation"):
                call()
            return
        outcome = call()
        if last is not None and seq <= last:
            expected = (False, m.state, "stale_sequence")
        elif m.state in (State.RELEASED, State.VOIDED):
            expected = (False, m.state, "settled")
        else:
            m.last_sequence = seq
            verdict = Verdict.MATCH if right_digest else Verdict.MISMATCH
            self._model_evidence(m, verdict.value, status, "callback")
            expected = (True, m.state, "")
        assert (outcome.applied, outcome.state, outcome.reason) == expected

    # -- invariants: the seven safety rules -------------------------------------------

    def _facts(self) -> Facts:
        """Everything the invariants look at, read once after each step."""
        if self._facts_cache is not None:
            return self._facts_cache
        facts = Facts()
        for key, *row in Operation.objects.values_list(
            "key",
            "state",
            "version",
            "recovered",
            "lookups_inconclusive",
            "last_callback_sequence",
            "params_digest",
        ):
            facts.operations[key] = tuple(row)
        for pk, key, status, digest, consumed_at in Permit.objects.values_list(
            "id", "operation_key", "status", "params_digest", "consumed_at"
        ):
            facts.permits[pk] = (key, status, digest)
            facts.consumed[pk] = int(consumed_at is not None)
        facts.dispatches = list(Dispatch.objects.values_list("operation__key", "permit_id"))
        for key, status, recovered, evidence_id in Dispatch.objects.values_list(
            "operation__key",
            "receipt_status",
            "receipt_recovered",
            Coalesce("receipt_evidence_id", "receipt_request_id"),
        ):
            facts.receipts[key] = (status, recovered, evidence_id)
        for key, kind, reason in PermitEvent.objects.order_by("id").values_list(
            "permit__operation_key", "kind", "reason"
        ):
            if kind == PermitEvent.Kind.REFUSED:
                facts.refused[key].append(reason)
        for key, reason, detail in PermitEvent.objects.filter(
            kind=PermitEvent.Kind.REFUSED, detail__has_key="count"
        ).values_list("permit__operation_key", "reason", "detail"):
            facts.counted[key][reason] += detail["count"]
        facts.events = list(
            AuditEvent.objects.order_by("id").values_list(
                "id", "kind", "operation_key", "data", "hash"
            )
        )
        for _, kind, key, data, _ in facts.events:
            facts.kinds[key][kind] += 1
            if kind == "transition":
                facts.transitions[key].append(data)
            elif kind == "host_report" and data.get("outcome") == COMMITTED:
                facts.committed_reports[key] += 1
        for pk, key, verdict, status in Evidence.objects.order_by("id").values_list(
            "id", "operation__key", "verdict", "provider_status"
        ):
            facts.evidence[pk] = (key, verdict, status)
        connection = sqlite3.connect(f"file:{self._provider_file()}?mode=ro", uri=True)
        try:
            for table in ("orders", "receipts"):
                for (key,) in connection.execute(f"SELECT operation_key FROM {table}"):
                    facts.provider_rows[(table, key)] += 1
        finally:
            connection.close()
        self._facts_cache = facts
        return facts

    @invariant()
    def rule1_one_dispatch_ever(self) -> None:
        facts = self._facts()
        dispatched = Counter(key for key, _ in facts.dispatches)
        assert all(n <= 1 for n in dispatched.values()), dispatched
        for key, m in self.ops.items():
            assert m.tokens_issued <= 1, f"{key}: {m.tokens_issued} fencing tokens handed out"
            assert dispatched[key] == m.tokens_issued, key
            assert m.effects <= 1
        for (table, key), n in facts.provider_rows.items():
            assert n <= 1, f"{table} holds {n} rows for {key}"
            assert dispatched[key] == 1, f"a provider effect for never-dispatched {key}"
            assert self.ops[key].effects == 1, f"{key}: an effect nobody performed"

    @invariant()
    def rule2_exact_action(self) -> None:
        facts = self._facts()
        dispatches = {permit_id: key for key, permit_id in facts.dispatches}
        assert set(dispatches) <= set(facts.permits), "a dispatch without a permit"
        for permit_id, (key, status, digest) in facts.permits.items():
            consumed = status == Permit.Status.CONSUMED
            assert consumed == (permit_id in dispatches), f"{key}: dispatch iff consumed"
            if consumed:
                assert digest == facts.operations[key][5] == self.ops[key].digest
                assert dispatches[permit_id] == key

    @invariant()
    def rule3_refusals_are_explicit(self) -> None:
        facts = self._facts()
        for key, m in self.ops.items():
            assert facts.refused[key] == m.refusals, f"{key}: {facts.refused[key]} != {m.refusals}"
            assert facts.counted[key] == m.counted, f"{key}: {facts.counted[key]} != {m.counted}"
            assert facts.kinds[key]["consume_refused"] == m.consume_refused, key

    @invariant()
    def rule4_only_matching_evidence_releases(self) -> None:
        facts = self._facts()
        for key, m in self.ops.items():
            for t in facts.transitions[key]:
                if t["to"] != State.RELEASED:
                    continue
                if t["event"] == "commit":  # the worker's own report, while it held the lease
                    assert t["from"] == State.DISPATCHED, t
                    assert facts.committed_reports[key] >= 1, key
                    continue
                if t["event"] == "confirm" and "request_id" in t:  # four eyes approved it
                    request = ReconciliationRequest.objects.get(pk=t["request_id"])
                    assert request.status == "approved" and request.operation_key == key
                    assert request.proposed_by != request.decided_by, t
                    continue
                assert t["event"] in ("evidence_match", "confirm"), t
                assert facts.evidence[t["evidence_id"]] == (key, Verdict.MATCH, COMMITTED), t
            if m.state == State.RELEASED:
                assert m.release_cause, f"{key} released without a cause"
            if m.recovered:
                assert (key, Verdict.MATCH, COMMITTED) in facts.evidence.values() or (
                    key,
                    Verdict.MATCH,
                    FAILED_STATUS,
                ) in facts.evidence.values()

    @invariant()
    def rule5_newer_verified_facts_win(self) -> None:
        facts = self._facts()
        for key, m in self.ops.items():
            if not m.registered:
                assert key not in facts.operations
                continue
            state, version = facts.operations[key][:2]
            assert (state, version) == (m.state, m.version), f"{key}: model says {m.history}"
            previous = self.seen.get(key)
            if previous is not None and previous != (state, version):
                old_state, old_version = previous
                assert version > old_version, f"{key}: version went {old_version} -> {version}"
                if old_state in TERMINAL_STATES:
                    assert (old_state, state) == (State.FAILED, State.RECONCILE), (
                        f"{key} left terminal {old_state} for {state}"
                    )
            self.seen[key] = (state, version)
            # The audited history is gap-free, version by version, and leaves a terminal
            # state only for reconcile, on a verified completion after a failure.
            walk_state, walk_version = State.AWAITING_APPROVAL.value, 1
            for t in facts.transitions[key]:
                assert t["from"] == walk_state and t["version"] == walk_version + 1, t
                if walk_state in TERMINAL_STATES:
                    assert (walk_state, t["event"], t["to"]) == (
                        State.FAILED,
                        "conflict",
                        State.RECONCILE,
                    ), t
                walk_state, walk_version = t["to"], t["version"]
            assert (walk_state, walk_version) == (state, version)
            assert [State.AWAITING_APPROVAL, *(t["to"] for t in facts.transitions[key])] == (
                m.history
            )

    @invariant()
    def rule6_revocation_and_expiry_guard_the_future(self) -> None:
        facts = self._facts()
        assert all(n <= 1 for n in facts.consumed.values()), facts.consumed
        dispatched = {key for key, _ in facts.dispatches}
        for key, m in self.ops.items():
            permits = {pk: row for pk, row in facts.permits.items() if row[0] == key}
            assert list(permits) == ([m.permit_id] if m.permit_id else []), key
            if m.permit_id is None:
                continue
            assert permits[m.permit_id][1] == m.permit_status, key
            if m.permit_was_consumed:
                assert m.permit_status == Permit.Status.CONSUMED
                assert facts.consumed[m.permit_id] == 1, key
            else:
                assert facts.consumed[m.permit_id] == 0, key
            if m.state in (State.REVOKED, State.EXPIRED):
                assert key not in dispatched

    @invariant()
    def rule7_everything_on_the_record(self) -> None:
        facts = self._facts()
        assert list(audit_verify()) == []
        assert len(facts.events) >= self.audit_count, "audit events disappeared"
        if self.audit_count:
            seq, _, _, _, digest = facts.events[self.audit_count - 1]
            assert (seq, digest) == self.audit_tip, "an audit event was rewritten"
        self.audit_count = len(facts.events)
        if facts.events:
            self.audit_tip = (facts.events[-1][0], facts.events[-1][4])
        for key, m in self.ops.items():
            if m.registered:
                assert facts.kinds[key]["transition"] == m.version - 1, key

    @invariant()
    def one_lookup_in_flight_at_most(self) -> None:
        in_flight = LookupAttempt.objects.filter(status__in=["queued", "running"])
        rows = Counter(in_flight.values_list("operation__key", "id"))
        expected = Counter((k, m.lookup_queued) for k, m in self.ops.items() if m.lookup_queued)
        assert rows == expected, (rows, expected)

    @invariant()
    def model_agrees_with_the_database(self) -> None:
        """Receipts, evidence, lookup budget and callback sequence are what the model says."""
        facts = self._facts()
        evidence: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for key, verdict, status in facts.evidence.values():
            evidence[key].append((verdict, status))
        for key, m in self.ops.items():
            if not m.registered:
                continue
            _, _, recovered, inconclusive, last_sequence, _ = facts.operations[key]
            assert (recovered, inconclusive, last_sequence) == (
                m.recovered,
                m.inconclusive,
                m.last_sequence,
            ), key
            assert evidence[key] == m.evidence, key
            receipt = facts.receipts.get(key)
            if m.receipt is None:
                assert receipt is None, key
            else:
                assert receipt is not None, key
                assert receipt[:2] == (m.receipt, m.receipt_recovered), key
                assert not m.receipt_recovered or receipt[2] is not None


def test_safety_rules_hold_under_random_interleavings(db: None) -> None:
    # One window for the whole run, and a limit a run reaches: the model predicts which
    # refusals get a line of their own and which are counted in a summary.
    with override_settings(
        SETTLE_REFUSAL_WINDOW_SECONDS=10**9, SETTLE_REFUSALS_RECORDED_PER_MINUTE=REFUSALS_RECORDED
    ):
        run_state_machine_as_test(
            SafetyMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                phases=[phase for phase in Phase if SHRINK or phase is not Phase.shrink],
                suppress_health_check=[
                    HealthCheck.function_scoped_fixture,
                    HealthCheck.too_slow,
                    HealthCheck.filter_too_much,
                ],
            ),
        )
