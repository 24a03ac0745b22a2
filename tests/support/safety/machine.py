"""Every party's steps in one machine, without the rules (the test module adds them)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
)

from recovery.models import (
    State,
)
from tests.support.safety.base import step
from tests.support.safety.hosts import HostSteps
from tests.support.safety.model import (
    HEAD_STARTS,
    KEYS,
    WORKERS,
)
from tests.support.safety.operators import OperatorSteps
from tests.support.safety.provider import ProviderSteps
from tests.support.safety.workers import WorkerSteps


class SafetySteps(HostSteps, WorkerSteps, ProviderSteps, OperatorSteps):
    """Every party's steps, and a head start that brings each key some way along."""

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
