"""Operators look up and decide; the background sweep and lookup workers run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import (
    precondition,
    rule,
)

from recovery.models import (
    LookupAttempt,
    Operation,
    State,
    Verdict,
)
from recovery.services.four_eyes import reconciliation_approve, reconciliation_reject
from recovery.services.lookup_tasks import lookup_attempt_run
from recovery.services.lookups import operation_lookup
from recovery.services.reconcile import operation_reconcile
from recovery.services.sweep import sweep
from tests.support.safety.base import SafetyBase, step
from tests.support.safety.model import (
    COMMITTED,
    FAILED_STATUS,
    KEYS,
    RECEIPT_FAILED,
    RUNNING,
    SUCCEEDED,
    OpModel,
    Refused,
)


class OperatorSteps(SafetyBase):
    """Operators look up and decide; the background sweep and lookup workers run."""

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
