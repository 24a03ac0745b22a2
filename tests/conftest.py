"""Shared fixtures: named credentials, a provider on disk, and API clients for them.

The clients and the other helpers tests import are in ``tests/support``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from approvals.services.approvers import approver_create
from harness.providers import sqlite_provider_init
from recovery.models import Host, Provider
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.console import Stuck, console_user
from tests.support.contract import response_check
from tests.support.flow import Api, Flow
from tests.support.strict import STRICT

# Real Celery processes (queue, celery_env, celery_procs), and a real OpenID Connect
# provider (identity_provider, idp), for any test that needs them.
pytest_plugins = ["tests.support.celery_fixtures", "tests.support.oidc"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if STRICT and connection.vendor != "postgresql":
        raise pytest.UsageError("SETTLE_REQUIRE_POSTGRES is set but DATABASE_URL is not PostgreSQL")


# What ``make test-fast`` leaves out (``-m "not processes and not browser"``): the folders
# whose tests start servers, workers or Chromium, marked here so that a new test there is
# counted without remembering a marker.
_PROCESS_FOLDERS = {"integration", "procs"}
_PROCESS_FIXTURES = {"celery_env", "celery_procs", "identity_provider"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        if "browser" in parts:
            item.add_marker(pytest.mark.browser)
        elif (_PROCESS_FOLDERS.intersection(parts) and "tests" in parts) or (
            _PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        ):
            item.add_marker(pytest.mark.processes)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if STRICT and skipped and exitstatus == 0:
        reporter.write_line(f"{skipped} test(s) skipped, and CI allows none", red=True)
        session.exitstatus = 1


@pytest.fixture(autouse=True)
def _cache_of_its_own(settings: Any, request: pytest.FixtureRequest) -> None:
    """Each test its own cache: the sign-in limits (allauth's, the failures recorded per
    address) count in it, and the checkout's file cache outlives a test and a run."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": request.node.nodeid,
        }
    }


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings: Any) -> None:
    """Passwords hashed at one PBKDF2 iteration, which the production settings still check
    (tests/support/hashers.py)."""
    settings.PASSWORD_HASHERS = ["tests.support.hashers.QuickPBKDF2PasswordHasher"]


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

    from harness.celery_procs import queue_name
    from tests.support.celery_fixtures import queue_delete

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


@pytest.fixture
def flow(host_api: Api, approver_api: Api, provider: Provider) -> Flow:
    return Flow(host_api, approver_api, provider)


# The console's operator and viewer of ``orders``, and its queue: the tests of several apps
# use them, not only the console's.


@pytest.fixture
def operator(provider: Provider) -> User:
    return console_user("olivia", "operator", provider)


@pytest.fixture
def viewer(provider: Provider) -> User:
    return console_user("victor", "viewer", provider)


@pytest.fixture
def stuck(flow: Flow, provider_db: Path) -> Stuck:
    return Stuck(flow, provider_db)


@pytest.fixture
def supervisor(provider: Provider) -> User:
    return console_user("sam", "supervisor", provider)


@pytest.fixture
def outsider(other_provider: Provider) -> User:
    """An operator, but of the other provider."""
    return console_user("oscar", "operator", other_provider)


@pytest.fixture
def other_stuck(host_api: Api, approver_api: Api, other_provider: Provider) -> Stuck:
    return Stuck(Flow(host_api, approver_api, other_provider), Path(other_provider.path))


# ``ledger``, a second provider: the console's outsider works on it, and the alerts tests
# tell its operations from those of ``orders``.
@pytest.fixture
def other_provider(db: None, tmp_path: Path) -> Provider:
    path = tmp_path / "ledger.sqlite3"
    sqlite_provider_init(path)
    created, _ = provider_configure(name="ledger", adapter="sqlite", path=str(path))
    return created
