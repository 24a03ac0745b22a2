"""The console's pages over many operations (``manage.py benchmark_console``).

    python manage.py benchmark_console --operations N [--requests R] [--reuse]

Figures, not a test. Seeds N operations into the configured database (``bench.seed``)
— which must hold none, so that nobody benchmarks production by accident; ``--reuse``
measures the operations a previous run left there instead of seeding — then requests
each page of ``PAGES`` R times (after ``WARM_UP`` untimed requests) through Django's
test client as a superuser and prints its p50 and p95 server time and its SQL statement
count, beside Django's admin change list of the same operations. The last line is one
JSON object with every figure.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, OutputWrapper
from django.test import Client
from django.test.utils import override_settings
from django.urls import NoReverseMatch, reverse

from bench import seed
from bench.sqlcount import statements_noted
from console.forms import cursor_encode
from recovery.models import Operation
from recovery.selectors.queue import QueueFilters, operations_queue_for_user

BENCH_USER = "bench-superuser"


@dataclass(frozen=True)
class Page:
    """One page measured: its URL name, the arguments and the query string it is asked with.

    ``args`` and ``query`` may be callables of the run (seeded keys, cursors), evaluated
    once before the page is measured.
    """

    name: str
    url_name: str
    args: Callable[[Run], list[Any]] = lambda run: []
    query: Callable[[Run], str] = lambda run: ""
    status: int = 200


@dataclass
class Run:
    """What the pages are asked about: a stuck operation, a deep cursor, a reference."""

    operations: int
    user: Any

    @property
    def stuck_key(self) -> str:
        # The middle of the table: an operation in reconcile, with evidence and a permit.
        middle = (self.operations // 2) // 20 * 20
        return seed.operation_key(middle + 20 if seed.kind_of(middle) == "unknown" else middle)

    @property
    def reference(self) -> str:
        return seed.provider_reference(self.operations // 2 // 20 * 20)

    def page_cursor(self, page: int) -> str:
        """The ``after`` of the queue's page ``page`` (1 is the first), found by paging."""
        after = None
        for _ in range(page - 1):
            found = operations_queue_for_user(
                user=self.user, filters=QueueFilters(), after=after, limit=50
            )
            if found.next_after is None:
                break
            after = found.next_after
        return "" if after is None else f"after={cursor_encode(after)}"


PAGES = [
    Page("queue", "home"),
    Page("queue_reconcile", "home", query=lambda run: "state=reconcile"),
    Page("queue_page_50", "home", query=lambda run: run.page_cursor(50)),
    Page("queue_search_key", "home", query=lambda run: f"q={run.stuck_key}"),
    Page("queue_search_none", "home", query=lambda run: "q=no-such-key"),
    # Enter on a provider reference opens its operation (operation_jump_for_user).
    Page(
        "search_reference",
        "home",
        query=lambda run: f"q={run.reference}&jump=1",
        status=302,
    ),
    Page("operation", "operation", args=lambda run: [run.stuck_key]),
    Page("audit_trail", "audit"),
    Page("dashboard", "dashboard"),
    Page("bulk_preview", "bulk-preview", query=lambda run: "state=reconcile"),
]
ADMIN = Page("admin_changelist", "admin:recovery_operation_changelist")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


# Untimed requests before a page is timed: its steady state in a long-lived process.
# psycopg prepares a statement at its 5th execution (``prepare_threshold``), and
# PostgreSQL plans a prepared statement afresh for its first 5 executions before it
# keeps a plan: a page's first eleven or so requests plan its statements every time.
WARM_UP = 12


def measure(client: Client, url: str, *, requests: int, status: int) -> dict[str, Any]:
    """p50/p95 server time in ms over ``requests`` requests (after ``WARM_UP``), SQL count."""
    with statements_noted() as statements:
        response = client.get(url)
    if response.status_code != status:
        raise CommandError(f"{url} answered {response.status_code}, expected {status}")
    for _ in range(WARM_UP - 1):
        client.get(url)
    times = []
    for _ in range(requests):
        began = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - began) * 1000)
    return {
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(_percentile(times, 0.95), 1),
        "sql": len(statements),
    }


def url_of(page: Page, run: Run) -> str | None:
    try:
        path = reverse(page.url_name, args=page.args(run))
    except NoReverseMatch:
        return None
    query = page.query(run)
    return f"{path}?{query}" if query else path


class ConsoleBenchmark:
    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout

    def run(self, *, operations: int, requests: int = 20, reuse: bool = False) -> dict[str, Any]:
        existing = Operation.objects.count()
        seeded: dict[str, Any] = {}
        if existing and not reuse:
            raise CommandError(
                f"this database already holds {existing} operations: benchmark_console seeds "
                "its own. Point DATABASE_URL at an empty database, or pass --reuse to measure "
                "the operations a previous run seeded."
            )
        if existing:
            if not Operation.objects.filter(key=seed.operation_key(0)).exists():
                raise CommandError("--reuse measures only operations benchmark_console seeded")
            operations = existing
        else:
            began = time.perf_counter()
            seeded = seed.seed_operations(
                operations, progress=lambda what: self.stdout.write(f"seeding {what}…")
            )
            seeded["seconds"] = round(time.perf_counter() - began, 1)
            self.stdout.write(f"seeded in {seeded['seconds']} s: {seeded}")
        user = get_user_model().objects.filter(username=BENCH_USER).first()
        if user is None:
            user = get_user_model().objects.create_superuser(BENCH_USER, "", None)
        run = Run(operations=operations, user=user)
        # The test client's host name: allowed for this run only.
        with override_settings(ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]):
            return self._measure(run, seeded, requests)

    def _measure(self, run: Run, seeded: dict[str, Any], requests: int) -> dict[str, Any]:
        client = Client()
        client.force_login(run.user)
        figures: dict[str, Any] = {"operations": run.operations, "pages": {}}
        if seeded:
            figures["seeded"] = seeded
        for page in PAGES:
            url = url_of(page, run)
            if url is None:
                figures["pages"][page.name] = "not built"
                self.stdout.write(f"{page.name:<20} not built")
                continue
            result = measure(client, url, requests=requests, status=page.status)
            figures["pages"][page.name] = result
            self._line(page.name, result)
        admin_url = url_of(ADMIN, run)
        assert admin_url is not None
        admin = measure(client, admin_url, requests=requests, status=200)
        figures["admin_changelist"] = admin
        self._line("admin_changelist", admin)
        self.stdout.write(json.dumps(figures))
        return figures

    def _line(self, name: str, result: dict[str, Any]) -> None:
        self.stdout.write(
            f"{name:<20} p50 {result['p50_ms']:>7} ms  p95 {result['p95_ms']:>7} ms"
            f"  SQL {result['sql']}"
        )
