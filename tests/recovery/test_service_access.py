"""Every service that acts for a console user checks the user's right itself.

Called directly, as a Celery task or a script would call them, with no view in front:
a user who may not see the provider is refused ``unknown_*`` (nothing recorded); one
who may see but not do is refused ``forbidden``, recorded on the operation's chain as
``operator_refused``; one who holds the permission gets what they asked for. An
approver is bounded by its scope whether or not the caller hands over its credential.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import Approval, Approver, ReconciliationRequest
from approvals.services.approvers import approver_create
from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of
from recovery.models import Operation, OperationClaim, Provider
from recovery.permissions import ProviderPermission as P
from recovery.services.errors import RecoveryError
from recovery.services.four_eyes import reconciliation_approve, reconciliation_reject
from recovery.services.operator import operation_claim, operation_claim_release, operator_lookup
from recovery.services.permits import approval_decision, permit_revoke
from recovery.services.providers import provider_configure
from recovery.services.reconcile import operation_reconcile
from tests.support.console import Stuck
from tests.support.flow import PARAMS, Flow

pytestmark = pytest.mark.django_db


def _user(name: str, *permissions: P, provider: Provider | None = None) -> Actor:
    user = get_user_model().objects.create_user(username=name)
    for permission in permissions:
        assign_perm(permission.perm, user, provider)
    return Actor.of("user", user)


@pytest.fixture
def unknown(flow: Flow, provider_db: Any) -> Operation:
    """An operation whose worker died and whose provider has no record: it waits."""
    return Stuck(flow, provider_db).unknown("op-1")


@pytest.fixture
def outsider(provider: Provider) -> Actor:
    """An operator of another provider: this one's operations do not exist for them."""
    ledger, _ = provider_configure(name="ledger", adapter="sqlite", path=provider.path)
    return _user("oscar", *P, provider=ledger)


def _refused(operation: Operation) -> list[tuple[str, str, Actor | None]]:
    events = AuditEvent.objects.filter(operation_key=operation.key, kind="operator_refused")
    return [(e.data["action"], e.data["code"], e.actor) for e in events.order_by("seq")]


def _refusal(call: Any) -> RecoveryError:
    with pytest.raises(RecoveryError) as refused:
        call()
    return refused.value


# -- lookup and claims: lookup_operations ------------------------------------------------


def test_operator_lookup_refuses_a_viewer_and_records_it(unknown, provider):
    viewer = _user("victor", P.VIEW_OPERATIONS, provider=provider)
    refusal = _refusal(
        lambda: operator_lookup(
            operation=unknown, version=unknown.version, reason="x", actor=viewer
        )
    )
    assert refusal.code == "forbidden"
    assert _refused(unknown) == [("lookup", "forbidden", viewer)]
    assert not unknown.lookups.filter(trigger="operator").exists()

    operator = _user("olivia", P.VIEW_OPERATIONS, P.LOOKUP_OPERATIONS, provider=provider)
    queued = operator_lookup(operation=unknown, version=unknown.version, reason="x", actor=operator)
    assert queued.attempt.trigger == "operator"


def test_operator_lookup_for_someone_who_may_not_see_it_is_unknown_and_unrecorded(
    unknown, outsider
):
    refusal = _refusal(
        lambda: operator_lookup(
            operation=unknown, version=unknown.version, reason="x", actor=outsider
        )
    )
    assert refusal.code == "unknown_operation"
    assert _refused(unknown) == []


@pytest.mark.parametrize("kind", ["host", "approver"])
def test_a_host_or_an_approver_holds_no_provider_permission(unknown, kind):
    refusal = _refusal(
        lambda: operator_lookup(
            operation=unknown, version=unknown.version, reason="x", actor=Actor(kind, "1", "x")
        )
    )
    assert refusal.code == "unknown_operation"


def test_claiming_and_releasing_need_lookup_operations(unknown, provider):
    viewer = _user("victor", P.VIEW_OPERATIONS, provider=provider)
    operator = _user("olivia", P.VIEW_OPERATIONS, P.LOOKUP_OPERATIONS, provider=provider)
    assert _refusal(lambda: operation_claim(operation=unknown, actor=viewer)).code == "forbidden"
    assert not OperationClaim.objects.exists()

    claim = operation_claim(operation=unknown, actor=operator)
    assert claim.actor == operator
    refusal = _refusal(lambda: operation_claim_release(operation=unknown, actor=viewer))
    assert refusal.code == "forbidden"
    assert OperationClaim.objects.exists()
    operation_claim_release(operation=unknown, actor=operator)
    assert not OperationClaim.objects.exists()
    assert _refused(unknown) == [
        ("claim", "forbidden", viewer),
        ("release", "forbidden", viewer),
    ]


# -- decisions: each one's permission, and propose_reconciliations ------------------------


@pytest.mark.parametrize(
    ("action", "permission"),
    [("confirm", P.CONFIRM_OPERATIONS), ("void", P.VOID_OPERATIONS)],
)
def test_a_decision_needs_its_own_permission(unknown, provider, action, permission):
    others = [p for p in P if p not in (permission, P.APPROVE_RECONCILIATIONS)]
    lacking = _user("otto", *others, provider=provider)
    refusal = _refusal(
        lambda: operation_reconcile(
            operation=unknown, action=action, version=unknown.version, reason="x", actor=lacking
        )
    )
    assert refusal.code == "forbidden"
    assert _refused(unknown) == [(action, "forbidden", lacking)]
    assert not ReconciliationRequest.objects.exists()

    holding = _user(
        "olivia", P.VIEW_OPERATIONS, permission, P.PROPOSE_RECONCILIATIONS, provider=provider
    )
    decided = operation_reconcile(
        operation=unknown, action=action, version=unknown.version, reason="x", actor=holding
    )
    assert decided.proposed  # no evidence backs it: proposed for a second operator


def test_a_repair_needs_repair_operations(unknown, provider):
    viewer = _user("victor", P.VIEW_OPERATIONS, provider=provider)
    refusal = _refusal(
        lambda: operation_reconcile(
            operation=unknown, action="repair", version=unknown.version, reason="x", actor=viewer
        )
    )
    assert refusal.code == "forbidden"
    # Holding it, the next rule speaks: an unsettled operation has nothing to repair.
    repairer = _user("rita", P.VIEW_OPERATIONS, P.REPAIR_OPERATIONS, provider=provider)
    refusal = _refusal(
        lambda: operation_reconcile(
            operation=unknown, action="repair", version=unknown.version, reason="x", actor=repairer
        )
    )
    assert refusal.code == "not_stranded"
    assert _refused(unknown) == [
        ("repair", "forbidden", viewer),
        ("repair", "not_stranded", repairer),
    ]


def test_an_unbacked_decision_needs_propose_reconciliations(unknown, provider):
    confirmer = _user("carl", P.VIEW_OPERATIONS, P.CONFIRM_OPERATIONS, provider=provider)
    refusal = _refusal(
        lambda: operation_reconcile(
            operation=unknown,
            action="confirm",
            version=unknown.version,
            reason="x",
            actor=confirmer,
        )
    )
    assert refusal.code == "four_eyes_required"
    assert not ReconciliationRequest.objects.exists()


def test_a_decision_for_someone_who_may_not_see_it_is_unknown_and_unrecorded(unknown, outsider):
    refusal = _refusal(
        lambda: operation_reconcile(
            operation=unknown, action="void", version=unknown.version, reason="x", actor=outsider
        )
    )
    assert refusal.code == "unknown_operation"
    assert _refused(unknown) == []


# -- four eyes: approve_reconciliations ---------------------------------------------------


@pytest.fixture
def proposal(unknown: Operation, provider: Provider) -> ReconciliationRequest:
    operator = _user(
        "olivia", P.VIEW_OPERATIONS, P.VOID_OPERATIONS, P.PROPOSE_RECONCILIATIONS, provider=provider
    )
    decided = operation_reconcile(
        operation=unknown, action="void", version=unknown.version, reason="x", actor=operator
    )
    assert decided.request is not None
    return decided.request


@pytest.mark.parametrize(
    ("decision", "service", "status"),
    [
        ("approve", reconciliation_approve, "approved"),
        ("reject", reconciliation_reject, "rejected"),
    ],
)
def test_deciding_a_proposal_needs_approve_reconciliations(
    unknown, provider, outsider, proposal, decision, service, status
):
    others = [p for p in P if p != P.APPROVE_RECONCILIATIONS]
    operator = _user("otto", *others, provider=provider)

    def decide(actor: Actor) -> Any:
        return service(operation=unknown, request_id=proposal.pk, reason="x", actor=actor)

    assert _refusal(lambda: decide(operator)).code == "forbidden"
    assert _refusal(lambda: decide(outsider)).code == "unknown_operation"
    assert _refused(unknown) == [(decision, "forbidden", operator)]
    proposal.refresh_from_db()
    assert proposal.status == "pending"

    supervisor = _user("sam", P.VIEW_OPERATIONS, P.APPROVE_RECONCILIATIONS, provider=provider)
    decide(supervisor)
    proposal.refresh_from_db()
    assert proposal.status == status


# -- an operation's approval: decide_approvals --------------------------------------------


@pytest.fixture
def pending(flow: Flow) -> Approval:
    flow.register()
    flow.host_api.post("/api/v1/operations/op-1/approvals")
    return Approval.objects.get()


def _decide(approval: Approval, actor: Actor) -> Any:
    return approval_decision(
        approval_id=approval.pk,
        approve=True,
        ttl_seconds=60,
        decided_by=actor,
        reviewed_digest=digest_of(PARAMS),
    )


def test_approval_decision_needs_decide_approvals(pending, provider, outsider):
    viewer = _user("victor", P.VIEW_OPERATIONS, provider=provider)
    assert _refusal(lambda: _decide(pending, viewer)).code == "forbidden"
    assert _refusal(lambda: _decide(pending, outsider)).code == "unknown_approval"
    nobody = _user("nobody")
    assert _refusal(lambda: _decide(pending, nobody)).code == "unknown_approval"
    pending.refresh_from_db()
    assert pending.status == "pending"
    assert Operation.objects.get().state == "awaiting_approval"
    # Refusals of a decision change nothing and are not operator actions.
    assert not AuditEvent.objects.filter(kind__in=["operator_refused", "decision_refused"])

    decider = _user("sam", P.DECIDE_APPROVALS, provider=provider)
    approval, permit = _decide(pending, decider)
    assert (approval.status, approval.decided_by) == ("approved", decider)
    assert permit is not None


def test_a_host_may_not_decide_approvals(pending):
    assert _refusal(lambda: _decide(pending, Actor("host", "1", "fleet-a"))).code == "forbidden"
    pending.refresh_from_db()
    assert pending.status == "pending"


# -- an approver: its scope, whether or not the caller passes its credential ---------------


def test_an_approver_actor_is_bounded_by_its_scope_without_its_row_passed(pending):
    ledger_phone, _ = approver_create(name="ledger-phone", providers=["ledger"])
    refusal = _refusal(lambda: _decide(pending, Actor.of("approver", ledger_phone)))
    assert refusal.code == "unknown_approval"
    pending.refresh_from_db()
    assert pending.status == "pending"

    orders_phone, _ = approver_create(name="orders-phone", providers=["orders"])
    approval, _ = _decide(pending, Actor.of("approver", orders_phone))
    assert approval.status == "approved"


def test_an_approver_actor_whose_credential_is_gone_or_disabled_decides_nothing(pending):
    phone, _ = approver_create(name="orders-phone", providers=["orders"])
    Approver.objects.filter(pk=phone.pk).update(disabled_at=timezone.now())
    assert _refusal(lambda: _decide(pending, Actor.of("approver", phone))).code == (
        "unknown_approval"
    )
    ghost = Actor("approver", "999999", "ghost")
    assert _refusal(lambda: _decide(pending, ghost)).code == "unknown_approval"


def test_an_approver_row_that_is_not_the_actors_is_refused(pending):
    phone, _ = approver_create(name="orders-phone", all_providers=True)
    other, _ = approver_create(name="other-phone", all_providers=True)
    refusal = _refusal(
        lambda: approval_decision(
            approval_id=pending.pk,
            approve=True,
            ttl_seconds=60,
            decided_by=Actor.of("approver", other),
            reviewed_digest=digest_of(PARAMS),
            approver=phone,
        )
    )
    assert refusal.code == "forbidden"


def test_revoking_as_an_approver_is_bounded_by_its_scope(flow):
    permit_id = flow.approved()["permit_id"]
    ledger_phone, _ = approver_create(name="ledger-phone", providers=["ledger"])
    refusal = _refusal(
        lambda: permit_revoke(
            permit_id=permit_id, reason="x", actor=Actor.of("approver", ledger_phone)
        )
    )
    assert refusal.code == "unknown_permit"
    orders_phone, _ = approver_create(name="orders-phone", providers=["orders"])
    permit, revoked = permit_revoke(
        permit_id=permit_id, reason="x", actor=Actor.of("approver", orders_phone)
    )
    assert revoked and permit.status == "revoked"
