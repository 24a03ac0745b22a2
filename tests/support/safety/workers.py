"""Workers dispatch, heartbeat, report, crash, and fresh workers resume."""

from __future__ import annotations

import math
from datetime import timedelta

from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import (
    precondition,
    rule,
)

from dbsql.clock import db_now
from harness.providers import (
    digest_of,
)
from recovery.models import (
    Dispatch,
    LookupAttempt,
    Operation,
    State,
)
from recovery.services.dispatch import (
    ReportOutcome,
    operation_dispatch,
    operation_heartbeat,
    operation_report,
)
from recovery.services.resume import LOOKUP_POLL_SECONDS, Decision, operation_resume
from tests.support.safety.base import SafetyBase, step
from tests.support.safety.model import (
    COMMITTED,
    FAILED_STATUS,
    FLEET,
    FORGED_TOKENS,
    KEYS,
    OTHER_PARAMS,
    RECEIPT_FAILED,
    RUNNING,
    SUCCEEDED,
    WORKERS,
    OpModel,
    Refused,
    params_for,
)


class WorkerSteps(SafetyBase):
    """Workers dispatch, heartbeat, report, crash, and fresh workers resume."""

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
