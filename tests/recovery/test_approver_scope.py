"""Approvers decide only within their scope, and only what they reviewed.

An approver is scoped to providers (or, said explicitly, all of them) and optionally to
hosts; outside its scope an approval or a permit does not exist for it (404). A decision
names the params digest the approver reviewed; another digest decides nothing.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from approvals.models import Approval, Approver, Permit
from approvals.services.approvers import approver_create
from audit.models import AuditEvent
from common.actors import COMMAND_LINE, Actor
from harness.providers import digest_of
from recovery.models import Operation
from recovery.services.providers import provider_configure
from tests.support.flow import PARAMS, Api

pytestmark = pytest.mark.django_db


def _approver(name: str, **scope) -> Api:
    return Api(approver_create(name=name, **scope)[1])


def _opened(flow) -> str:
    flow.register()
    return flow.host_api.post("/api/v1/operations/op-1/approvals").json()["approval_id"]


def _decide(api: Api, approval_id: str, digest: str | None = None):
    body = {"decision": "approve", "params_digest": digest or digest_of(PARAMS)}
    return api.post(f"/api/v1/approvals/{approval_id}/decision", body)


def test_an_approver_sees_exactly_what_it_would_approve(flow):
    approval_id = _opened(flow)
    seen = _approver("desk", providers=["orders"]).get(f"/api/v1/approvals/{approval_id}")
    assert seen.status_code == 200
    body = seen.json()
    assert (body["action"], body["provider"], body["host"]) == ("payment.send", "orders", "fleet-a")
    assert (body["params"], body["params_digest"]) == (PARAMS, digest_of(PARAMS))
    assert (body["status"], body["permit_id"], body["expires_at"]) == ("pending", None, None)


def test_an_approver_in_scope_decides(flow):
    approval_id = _opened(flow)
    response = _decide(_approver("desk", providers=["orders"]), approval_id)
    assert response.status_code == 200, response.content
    assert Operation.objects.get().state == "approved"


@pytest.mark.parametrize(
    "scope",
    [{"providers": ["ledger"]}, {"providers": ["orders"], "hosts": ["fleet-b"]}],
    ids=["other provider", "other host"],
)
def test_outside_its_scope_an_approval_and_a_permit_do_not_exist(flow, other_host_api, scope):
    approval_id = _opened(flow)
    outsider = _approver("outsider", **scope)
    assert outsider.get(f"/api/v1/approvals/{approval_id}").status_code == 404
    response = _decide(outsider, approval_id)
    assert (response.status_code, response.json()["error"]) == (404, "unknown_approval")
    assert Approval.objects.get().status == "pending"
    assert Operation.objects.get().state == "awaiting_approval"

    permit_id = _decide(flow.approver_api, approval_id).json()["permit_id"]
    revoked = outsider.post(f"/api/v1/permits/{permit_id}/revoke", {"reason": "not mine"})
    assert (revoked.status_code, revoked.json()["error"]) == (404, "unknown_permit")
    assert Permit.objects.get().status == "active"


def test_an_approver_revokes_a_permit_in_its_scope(flow):
    permit_id = flow.approved()["permit_id"]
    api = _approver("desk", providers=["orders"], hosts=["fleet-a"])
    response = api.post(f"/api/v1/permits/{permit_id}/revoke", {"reason": "changed mind"})
    assert response.json() == {"permit_id": permit_id, "status": "revoked", "revoked": True}


def test_a_decision_on_another_digest_is_refused_and_recorded(flow):
    approval_id = _opened(flow)
    other = digest_of({**PARAMS, "amount": 999999})
    response = _decide(flow.approver_api, approval_id, other)
    assert response.status_code == 409
    assert response.json()["error"] == "digest_mismatch"
    assert response.json()["params_digest"] == digest_of(PARAMS)
    assert Approval.objects.get().status == "pending"
    assert Operation.objects.get().state == "awaiting_approval"
    refused = AuditEvent.objects.get(kind="decision_refused")
    assert (refused.data["reviewed_digest"], refused.actor) == (
        other,
        Actor.of("approver", Approver.objects.get(name="alice-phone")),
    )


def test_create_approver_needs_an_explicit_scope(provider, host, capsys):
    with pytest.raises(CommandError, match="--provider P"):
        call_command("create_approver", "nobody")
    with pytest.raises(CommandError, match="no provider or host named ghost"):
        call_command("create_approver", "desk", "--provider", "ghost")
    call_command("create_approver", "desk", "--provider", "orders", "--host", "fleet-a")
    desk = Approver.objects.get(name="desk")
    assert (desk.providers, desk.hosts, desk.all_providers) == (["orders"], ["fleet-a"], False)
    assert capsys.readouterr().out.strip().startswith("sta_")


def test_an_approver_scope_follows_a_provider_rename(provider):
    approver_create(name="desk", providers=["orders"])
    provider_configure(name="orders", adapter="sqlite", path=provider.path)
    from recovery.services.providers import ProviderSettings, provider_save

    provider_save(
        provider_id=provider.pk,
        settings=ProviderSettings(name="orders-eu", adapter="sqlite", path=provider.path),
        actor=COMMAND_LINE,
    )
    assert Approver.objects.get(name="desk").providers == ["orders-eu"]
