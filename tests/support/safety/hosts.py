"""Hosts register and ask for approval; approvers approve, deny, revoke; permits expire."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from hypothesis import strategies as st
from hypothesis.stateful import (
    precondition,
    rule,
)

from approvals.models import Permit
from dbsql.clock import db_now
from recovery.models import (
    Operation,
    State,
)
from recovery.services.permits import approval_decision, approval_open, permit_revoke
from recovery.services.registration import operation_register
from tests.support.safety.base import SafetyBase, step
from tests.support.safety.model import (
    ACTION,
    KEYS,
    OTHER_PARAMS,
    PROVIDER,
    TTL_SECONDS,
    OpModel,
    Refused,
)


class HostSteps(SafetyBase):
    """Hosts register and ask for approval; approvers approve, deny, revoke; permits expire."""

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
