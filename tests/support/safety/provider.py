"""The provider performs, damages and repairs its record, goes offline, calls back."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    precondition,
    rule,
)

from harness.providers import (
    digest_of,
    sqlite_provider_commit,
    sqlite_provider_tamper,
)
from recovery.models import (
    State,
    Verdict,
)
from recovery.services.callbacks import CallbackOutcome, provider_callback
from tests.support.safety.base import SafetyBase, step
from tests.support.safety.model import (
    COMMITTED,
    DAMAGE_MODES,
    FAILED_STATUS,
    KEYS,
    OTHER_PARAMS,
    UNREGISTERED_KEY,
    OpModel,
    Record,
    Refused,
)


class ProviderSteps(SafetyBase):
    """The provider performs, damages and repairs its record, goes offline, calls back."""

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
