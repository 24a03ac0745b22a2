"""The console's cast: an operator, a viewer and an outsider, and operations that wait.

``orders`` is the provider the operator (and the viewer) work on; ``ledger`` is another
provider, whose operator is the outsider. Operations reach the queue through the host
API, the way they do in production: registered, approved, dispatched, the worker's
lease lapses, a fresh worker's resume queues a lookup of the record, and a background
worker (the task's body, run here) looks it up.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from approvals.actors import Actor
from audit.chain import audit_transaction
from recovery.models import Dispatch, LookupAttempt, Operation, Provider
from recovery.services.locking import operation_lock
from recovery.services.lookups import lookup_claim
from recovery.services.providers import provider_configure
from recovery.services.roles import role_grant, roles_ensure
from tests.conftest import PARAMS, Api, Flow, digest_of, lookup_due
from tests.support.providers import sqlite_provider_commit, sqlite_provider_init

PASSWORD = "a-password-for-tests-only"


def console_user(username: str, role: str | None = None, provider: Provider | None = None) -> User:
    user = User.objects.create_user(username, password=PASSWORD)
    if role is not None and provider is not None:
        roles_ensure()
        role_grant(user=user, role=role, provider=provider, actor=Actor.system("test"))
    return user


@pytest.fixture
def other_provider(db: None, tmp_path: Path) -> Provider:
    path = tmp_path / "ledger.sqlite3"
    sqlite_provider_init(path)
    created, _ = provider_configure(name="ledger", adapter="sqlite", path=str(path))
    return created


@pytest.fixture
def operator(provider: Provider) -> User:
    return console_user("olivia", "operator", provider)


@pytest.fixture
def viewer(provider: Provider) -> User:
    return console_user("victor", "viewer", provider)


@pytest.fixture
def supervisor(provider: Provider) -> User:
    return console_user("sam", "supervisor", provider)


@pytest.fixture
def outsider(other_provider: Provider) -> User:
    """An operator, but of the other provider."""
    return console_user("oscar", "operator", other_provider)


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


@pytest.fixture
def stuck(flow: Flow, provider_db: Path) -> Stuck:
    return Stuck(flow, provider_db)


@pytest.fixture
def other_stuck(host_api: Api, approver_api: Api, other_provider: Provider) -> Stuck:
    return Stuck(Flow(host_api, approver_api, other_provider), Path(other_provider.path))


def aged(operation: Operation, *, minutes: float) -> Operation:
    """Move the time the operation entered its state back (the queue orders by it)."""
    Operation.objects.filter(pk=operation.pk).update(
        updated_at=timezone.now() - timedelta(minutes=minutes)
    )
    operation.refresh_from_db()
    return operation


@pytest.fixture
def signed_in(client: Client) -> Any:
    """``signed_in(user)``: the test's client, signed in as ``user``."""

    def sign_in(user: User) -> Client:
        client.force_login(user)
        return client

    return sign_in


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
