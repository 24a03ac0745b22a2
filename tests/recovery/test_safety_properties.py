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

from collections import Counter, defaultdict

from django.test import override_settings
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    invariant,
    run_state_machine_as_test,
)

from approvals.models import Permit, ReconciliationRequest
from audit.verify_walk import audit_verify
from recovery.models import (
    TERMINAL_STATES,
    LookupAttempt,
    State,
    Verdict,
)
from tests.support.safety.machine import SafetySteps
from tests.support.safety.model import (
    COMMITTED,
    EXAMPLES,
    FAILED_STATUS,
    REFUSALS_RECORDED,
    SHRINK,
    STEPS,
)


class SafetyMachine(SafetySteps):
    """The seven rules, and the model's agreement with the database, after every step."""

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
