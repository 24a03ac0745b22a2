"""The console's cast and queue, as the console's tests (and others) build them: users
with a role on a provider, and operations put into the queue through the host API."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from audit.chain import audit_transaction
from bulk.models import BulkBatch
from bulk.running import bulk_chunk_run, bulk_publish
from common.actors import Actor
from harness.accounts import PASSWORD
from harness.providers import digest_of, sqlite_provider_commit
from recovery.models import Dispatch, LookupAttempt, Operation, Provider
from recovery.services.locking import operation_lock
from recovery.services.lookups import lookup_claim
from recovery.services.roles import role_grant, roles_ensure
from tests.support.flow import PARAMS, Flow, lookup_due


def console_user(username: str, role: str | None = None, provider: Provider | None = None) -> User:
    user = User.objects.create_user(username, password=PASSWORD)
    if role is not None and provider is not None:
        roles_ensure()
        role_grant(user=user, role=role, provider=provider, actor=Actor.system("test"))
    return user


class Stuck:
    """Puts operations of one provider into the queue through the host API."""

    def __init__(self, flow: Flow, provider_db: Path) -> None:
        self.flow = flow
        self.provider_db = provider_db

    def _lapsed(self, key: str, params: dict[str, Any]) -> None:
        self.flow.approved(key, params)
        assert self.flow.dispatch(key, digest_of(params), worker="w-dead").status_code == 200
        Dispatch.objects.filter(operation__key=key).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )

    def unknown(self, key: str, *, params: dict[str, Any] = PARAMS) -> Operation:
        """The worker died and the provider has no record yet: unknown, receipt stranded."""
        self._lapsed(key, params)
        assert self.flow.resume_looked_up(key)["state"] == "unknown"
        return Operation.objects.get(key=key)

    def mismatch(self, key: str) -> Operation:
        """The provider's record holds other parameters: reconcile."""
        self._lapsed(key, PARAMS)
        sqlite_provider_commit(
            self.provider_db, operation_key=key, params={**PARAMS, "amount": 9}, reference="x-1"
        )
        assert self.flow.resume_looked_up(key)["state"] == "reconcile"
        return Operation.objects.get(key=key)

    def conflict(self, key: str, *, host_says: str, provider_says: str) -> Operation:
        """The host reported one outcome after its lease lapsed and the provider's record
        says the other: a lookup finds the contradiction, reconcile, with that evidence."""
        self._lapsed(key, PARAMS)
        token = Dispatch.objects.get(operation__key=key).fencing_token
        assert self.flow.resume_looked_up(key)["state"] == "unknown"
        late = self.flow.host_api.post(
            f"/api/v1/operations/{key}/result", {"fencing_token": token, "outcome": host_says}
        )
        assert late.status_code == 200
        sqlite_provider_commit(
            self.provider_db,
            operation_key=key,
            params=PARAMS,
            reference="r-7",
            status=provider_says,
        )
        lookup_due(key)
        assert self.flow.resume_looked_up(key)["state"] == "reconcile"
        return Operation.objects.get(key=key)

    def released(self, key: str) -> Operation:
        """Settled from matching evidence: not in the queue."""
        self._lapsed(key, PARAMS)
        sqlite_provider_commit(self.provider_db, operation_key=key, params=PARAMS, reference="r-1")
        assert self.flow.resume_looked_up(key)["state"] == "released"
        return Operation.objects.get(key=key)


def aged(operation: Operation, *, minutes: float) -> Operation:
    """Move the time the operation entered its state back (the queue orders by it)."""
    Operation.objects.filter(pk=operation.pk).update(
        updated_at=timezone.now() - timedelta(minutes=minutes)
    )
    operation.refresh_from_db()
    return operation


def client_for(user: User | None, *, csrf_checks: bool = False) -> Client:
    """A test client signed in as ``user`` (anonymous for None)."""
    client = Client(enforce_csrf_checks=csrf_checks)
    if user is not None:
        client.force_login(user)
    return client


def queue_lookup(operation: Operation) -> LookupAttempt:
    """A lookup claimed for a background worker, as the sweep claims one."""
    with audit_transaction():
        slot = lookup_claim(
            operation=operation_lock(operation),
            trigger=LookupAttempt.Trigger.TASK,
            actor=Actor.system("test"),
            due_only=False,
            queued=True,
        )
    assert slot.attempt is not None
    return slot.attempt


def run_batch(batch: BulkBatch) -> int:
    """Every chunk of the batch, as a worker runs its messages; how many chunks."""
    chunks: list[tuple[str, int, int]] = []
    bulk_publish(batch, send=lambda *args: chunks.append(args))
    for batch_id, first, last in chunks:
        bulk_chunk_run(batch_id=batch_id, first=first, last=last)
    return len(chunks)


def pending_approval(
    flow: Flow, key: str, *, params: dict[str, Any] = PARAMS, **policy: Any
) -> Approval:
    """An operation registered and its approval asked for, through the host API; then
    what a policy would have set on it (``rule``, ``required``, ``groups``…).

    Decided by votes whenever a policy would have it so (``Approval.voting``): more
    than one person, named groups, a proposer left out or a passkey.
    """
    flow.register(key, params)
    response = flow.host_api.post(f"/api/v1/operations/{key}/approvals")
    assert response.status_code in (200, 201), response.content
    approval_id = response.json()["approval_id"]
    if policy:
        voting = bool(
            policy.get("required", 1) > 1
            or policy.get("groups")
            or policy.get("proposer")
            or policy.get("passkey_required")
        )
        Approval.objects.filter(pk=approval_id).update(**{"voting": voting, **policy})
    return Approval.objects.get(pk=approval_id)
