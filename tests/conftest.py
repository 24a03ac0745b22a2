"""Shared fixtures: named credentials, a provider on disk, and an API client helper."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from approvals.services import approver_create
from common.canonical import canonical_params, params_digest
from recovery.models import Host, Provider
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.contract import response_check
from tests.support.providers import sqlite_provider_init

# Real Celery processes (queue, celery_env, celery_procs), for any test that needs them.
pytest_plugins = ["tests.support.celery_fixtures"]

PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7"}

# CI sets SETTLE_REQUIRE_POSTGRES: there the suite must run on PostgreSQL and nothing
# may be skipped, so a missing service or a skip marker fails the run loudly.
STRICT = bool(os.environ.get("SETTLE_REQUIRE_POSTGRES"))


def pytest_sessionstart(session: pytest.Session) -> None:
    if STRICT and connection.vendor != "postgresql":
        raise pytest.UsageError("SETTLE_REQUIRE_POSTGRES is set but DATABASE_URL is not PostgreSQL")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if STRICT and skipped and exitstatus == 0:
        reporter.write_line(f"{skipped} test(s) skipped, and CI allows none", red=True)
        session.exitstatus = 1


def _flush_past_audit_triggers() -> None:
    """Let the test runner's flush TRUNCATE the append-only audit tables (PostgreSQL).

    The triggers refuse TRUNCATE to everyone; between tests only, the flush runs with
    ``session_replication_role = replica`` (superuser-only), which skips user triggers.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
        try:
            original(self, sql_list)
        finally:
            with self.connection.cursor() as cursor:
                cursor.execute("SET session_replication_role = DEFAULT")

    DatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]


_flush_past_audit_triggers()


@pytest.fixture(autouse=True)
def _responses_follow_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every API response a test receives must be one the OpenAPI document describes."""
    receive = Client.request

    def request(self: Client, **environ: Any) -> Any:
        response = receive(self, **environ)
        if not environ["PATH_INFO"].startswith("/api/"):
            return response
        response_check(
            environ["REQUEST_METHOD"],
            environ["PATH_INFO"],
            response.status_code,
            response.get("Content-Type", ""),
            response.content,
        )
        return response

    monkeypatch.setattr(Client, "request", request)


@pytest.fixture(scope="session", autouse=True)
def _lookups_published_to_this_runs_queue() -> Iterator[None]:
    """Resume and the console publish the lookups they queue. In-process tests run those
    lookups themselves (``queued_lookups_run``), so the messages go to a queue of this
    run's own, deleted at the end, never to a deployment's (and a commit's webhook nudge
    to this run's webhook queue); a test with a real worker points the setting at that
    worker's queue."""
    from django.test import override_settings

    from tests.support.celery_fixtures import queue_delete
    from tests.support.celery_procs import queue_name

    name = queue_name()
    with override_settings(CELERY_TASK_DEFAULT_QUEUE=name, SETTLE_WEBHOOK_QUEUE=f"{name}-webhooks"):
        yield
    queue_delete(name)
    queue_delete(f"{name}-webhooks")


@pytest.fixture(autouse=True)
def _audit_checkpoint_file(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test has a checkpoint file of its own, as each has a database of its own."""
    folder = tmp_path_factory.mktemp("audit")
    settings.SETTLE_AUDIT_CHECKPOINT_FILE = folder / "checkpoints.jsonl"


def lookup_due(key: str) -> None:
    """Time passes until the operation's next lookup is due (resume looks up only then)."""
    from datetime import timedelta

    from django.utils import timezone

    from recovery.models import Operation

    Operation.objects.filter(key=key).update(next_lookup_at=timezone.now() - timedelta(seconds=1))


def queued_lookups_run() -> int:
    """Run every queued lookup attempt as a background worker runs it; how many ran.

    Resume and the console queue lookups for Celery; here the worker's work is done in
    this process, by the task's own body (``lookup_attempt_run``), in id order.
    """
    from recovery.models import LookupAttempt
    from recovery.services.lookup_tasks import lookup_attempt_run

    queued = LookupAttempt.objects.filter(status=LookupAttempt.Status.QUEUED).order_by("pk")
    ran = 0
    for attempt_id in queued.values_list("pk", flat=True):
        ran += lookup_attempt_run(attempt_id=attempt_id).looked_up
    return ran


def lookups_published() -> list[int]:
    """Take every message published to this run's queue so far: the attempts they name.

    Read from the broker itself (CI: Redis), as a worker would receive them.
    """
    from celery import current_app
    from django.conf import settings

    attempt_ids = []
    with current_app.connection_for_read() as broker:
        messages = broker.SimpleQueue(settings.CELERY_TASK_DEFAULT_QUEUE)
        while True:
            try:
                message = messages.get(timeout=0.2)
            except messages.Empty:
                break
            assert message.headers["task"] == "recovery.tasks.lookup_attempt", message.headers
            args, _, _ = message.payload  # Celery's message protocol 2
            attempt_ids.append(int(args[0]))
            message.ack()
        messages.close()
    return attempt_ids


def digest_of(params: dict[str, Any]) -> str:
    return params_digest(canonical_params(params))


@dataclass
class Api:
    """A JSON client holding one bearer token."""

    token: str
    client: Client = field(default_factory=Client)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None, **headers: str):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            path,
            data=data,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
            **headers,
        )

    def get(self, path: str):
        return self.client.get(path, HTTP_AUTHORIZATION=f"Bearer {self.token}")


@pytest.fixture
def provider_db(tmp_path: Path) -> Path:
    path = tmp_path / "orders.sqlite3"
    sqlite_provider_init(path)
    return path


@pytest.fixture
def provider(db: None, provider_db: Path) -> Provider:
    created, _ = provider_configure(
        name="orders",
        adapter="sqlite",
        path=str(provider_db),
        lease_seconds=60,
        timeout_seconds=2,
    )
    return created


@pytest.fixture
def host_api(db: None) -> Api:
    _, token = host_create(name="fleet-a")
    return Api(token)


@pytest.fixture
def other_host_api(db: None) -> Api:
    _, token = host_create(name="fleet-b")
    return Api(token)


@pytest.fixture
def approver_api(db: None) -> Api:
    _, token = approver_create(name="alice-phone", all_providers=True)
    return Api(token)


@pytest.fixture
def host(host_api: Api) -> Host:
    return Host.objects.get(name="fleet-a")


class Flow:
    """Drives one operation through the API: register → approve → dispatch…"""

    def __init__(self, host_api: Api, approver_api: Api, provider: Provider) -> None:
        self.host_api = host_api
        self.approver_api = approver_api
        self.provider = provider

    def register(self, key: str = "op-1", params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.host_api.post(
            "/api/v1/operations",
            {
                "key": key,
                "action": "payment.send",
                "provider": self.provider.name,
                "params": params if params is not None else PARAMS,
            },
        )
        assert response.status_code in (200, 201), response.content
        return response.json()

    def approve(self, key: str = "op-1", ttl_seconds: int = 300) -> dict[str, Any]:
        approval = self.host_api.post(f"/api/v1/operations/{key}/approvals").json()
        path = f"/api/v1/approvals/{approval['approval_id']}"
        reviewed = self.approver_api.get(path).json()  # the approver sees the exact action
        response = self.approver_api.post(
            f"{path}/decision",
            {
                "decision": "approve",
                "ttl_seconds": ttl_seconds,
                "params_digest": reviewed["params_digest"],
            },
        )
        assert response.status_code == 200, response.content
        return response.json()

    def approved(self, key: str = "op-1", params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.register(key, params)
        return self.approve(key)

    def dispatch(self, key: str = "op-1", digest: str | None = None, worker: str = "w1"):
        return self.host_api.post(
            f"/api/v1/operations/{key}/dispatch",
            {"worker": worker, "params_digest": digest or digest_of(PARAMS)},
        )

    def resume(self, key: str = "op-1", worker: str = "w2") -> dict[str, Any]:
        response = self.host_api.post(f"/api/v1/operations/{key}/resume", {"worker": worker})
        assert response.status_code == 200, response.content
        return response.json()

    def resume_looked_up(self, key: str = "op-1", worker: str = "w2") -> dict[str, Any]:
        """Resume as a host that polls: the lookup it queued runs, then it asks again."""
        first = self.resume(key, worker)
        assert first["decision"] == "in_progress" and first["state"] != "dispatched", first
        assert queued_lookups_run() == 1
        return self.resume(key, worker)

    def record(self, key: str = "op-1") -> dict[str, Any]:
        return self.host_api.get(f"/api/v1/operations/{key}").json()


@pytest.fixture
def flow(host_api: Api, approver_api: Api, provider: Provider) -> Flow:
    return Flow(host_api, approver_api, provider)
