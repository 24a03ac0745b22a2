"""The machine's world: a provider, hosts, people, a savepoint per example, and the facts read."""

from __future__ import annotations

import functools
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.functions import Coalesce
from guardian.shortcuts import assign_perm
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
)

from approvals.models import Permit, PermitEvent
from approvals.services.approvers import approver_create
from approvals.services.errors import Refusal
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import (
    digest_of,
    sqlite_provider_init,
)
from recovery.models import (
    Dispatch,
    Evidence,
    LookupAttempt,
    Operation,
    Provider,
    State,
    Verdict,
)
from recovery.permissions import ProviderPermission
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from recovery.services.resume import Decision
from recovery.services.roles import OPERATOR, SUPERVISOR
from tests.support.safety.model import (
    COMMITTED,
    FAILED_STATUS,
    KEYS,
    LOOKUP_BUDGET,
    PROVIDER,
    RECEIPT_FAILED,
    REFUSALS_RECORDED,
    RUNNING,
    SUCCEEDED,
    Facts,
    OpModel,
    answer_for,
    params_for,
)


def step(method: Callable[..., None]) -> Callable[..., None]:
    """Mark a rule as changing the world: the invariants read the database afresh."""

    @functools.wraps(method)
    def wrapper(self: SafetyBase, *args: Any, **kwargs: Any) -> None:
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


class SafetyBase(RuleBasedStateMachine):
    """The world the steps act on, the model beside it, and the facts the invariants read."""

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
