"""``manage.py demo``: seed Settle from a fleet of real crashes, then serve it.

Runs on the embedded default (SQLite and the filesystem broker under ``var/``). A second
run reuses the database and adds a batch with keys of its own.

The Celery worker starts before the fleet: a replacement worker's resume only queues a
lookup (resume never reads a provider inside a web request), and the worker runs it. The
seeding waits for those lookups, so the summary shows what their evidence settled.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals.services.approvers import approver_create
from common.actors import COMMAND_LINE
from console.demo import fleet
from recovery.models import (
    LOOKUP_IN_FLIGHT,
    Dispatch,
    Host,
    LookupAttempt,
    Operation,
    Provider,
)
from recovery.permissions import ProviderPermission
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from recovery.services.roles import role_grant, roles_ensure

# DEMO ONLY: well-known passwords for a throwaway database on one machine.
DEMO_USERS = (
    ("viewer", "viewer", "demo-viewer"),
    ("operator", "operator", "demo-operator"),
    ("supervisor", "supervisor", "demo-supervisor"),
)
LEASE_SECONDS = 2  # short, so that the dead workers' leases lapse while you watch
# How long the seeding waits for the lookups the replacement workers' resumes queued.
LOOKUPS_TIMEOUT = 60.0
ORDERS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS orders (operation_key TEXT PRIMARY KEY, "
    "reference TEXT NOT NULL, status TEXT NOT NULL, created_at TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS receipts (operation_key TEXT PRIMARY KEY, "
    "params_json TEXT NOT NULL, params_digest TEXT NOT NULL)",
)


class Stop(Exception):
    """SIGINT or SIGTERM: stop the children and leave."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


class Command(BaseCommand):
    help = (
        "Seed a demo from real worker processes (some killed with SIGKILL mid-operation), "
        "then serve the console with Celery workers (lookups, webhooks) and beat until Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-serve", action="store_true", help="seed only, then exit")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=None, help="default $PORT or 8000")

    def handle(self, *args: Any, **options: Any) -> None:
        if importlib.util.find_spec("settle_client") is None:
            # The demo is not production: its workers need the client library, which a
            # production install (`pip install .`) leaves out.
            raise CommandError(
                "the demo's workers use the client library: pip install ./clients/python "
                "(make run installs it)"
            )
        port = options["port"] or int(os.environ.get("PORT", "8000"))
        serve = not options["no_serve"]
        var = Path(settings.VAR_DIR)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        children: list[fleet.Child] = []
        try:
            call_command("migrate", interactive=False, verbosity=0)
            providers = self._providers(var / "demo")
            self._users(providers)
            batch = self._next_batch()
            tokens = self._credentials(batch)
            self.stdout.write(f"Seeding batch {batch} in {var} with a fleet of real workers …")
            worker = fleet.celery_start("worker", var / "log" / "celery-worker.log")
            children.append(worker)
            if serve:
                web, url = fleet.web_start(
                    host=options["host"], port=port, workers=2, log_path=var / "log" / "web.log"
                )
            else:
                web, url = fleet.web_start(
                    host="127.0.0.1",
                    port=fleet.free_port(),
                    workers=1,
                    log_path=var / "log" / "web.log",
                )
            children.append(web)
            report = fleet.fleet_run(
                url=url,
                batch=batch,
                tokens=tokens,
                providers={p.name: (p.adapter, p.path) for p in providers},
                lease_seconds=LEASE_SECONDS,
            )
            self._lookups_wait(batch, worker)
            self._summary(batch, report)
            if not serve:
                for child in reversed(children):
                    child.stop()
                children.clear()
                return
            # Webhook deliveries have a queue and a worker of their own (an endpoint
            # added with `manage.py webhook add` while the demo runs is delivered to).
            children.append(fleet.celery_start("webhooks", var / "log" / "celery-webhooks.log"))
            children.append(fleet.celery_start("beat", var / "log" / "celery-beat.log"))
            self._served(url, var, children)
            while all(child.alive() for child in children):
                time.sleep(0.5)
            dead = [child.name for child in children if not child.alive()]
            self.stderr.write(f"{', '.join(dead)} exited; stopping the demo (logs in {var}/log)")
        except Stop as why:
            self.stdout.write(f"\n{why}: stopping the web server, the workers and beat …")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for child in reversed(children):
                child.stop()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if children:
                self.stdout.write("stopped.")

    def _providers(self, directory: Path) -> list[Provider]:
        """The SQLite order database and the JSONL journal, files under var/demo."""
        directory.mkdir(parents=True, exist_ok=True)
        orders, journal = directory / "orders.sqlite3", directory / "journal.jsonl"
        connection = sqlite3.connect(orders)
        try:
            for statement in ORDERS_SCHEMA:
                connection.execute(statement)
            connection.commit()
        finally:
            connection.close()
        journal.touch()
        configured = []
        # Names of their own, so that the demo never reconfigures a provider of yours.
        for name, adapter, path in (
            ("demo-orders", "sqlite", orders),
            ("demo-journal", "journal", journal),
        ):
            provider, _ = provider_configure(
                name=name, adapter=adapter, path=str(path), lease_seconds=LEASE_SECONDS
            )
            configured.append(provider)
        # A payment API that is down: nothing listens on the discard port, so every
        # lookup is refused at once (unavailable) and its budget runs out while you watch.
        provider, _ = provider_configure(
            name="demo-payments",
            adapter="http",
            url="http://127.0.0.1:9/settle/records",
            secret="demo-payments-secret",
            timeout_seconds=1.0,
            lease_seconds=LEASE_SECONDS,
            lookup_budget=3,
        )
        configured.append(provider)
        return configured

    def _users(self, providers: list[Provider]) -> None:
        """The three demo users, each with their role on both providers (grant service)."""
        roles_ensure()
        model = get_user_model()
        for username, role, password in DEMO_USERS:
            user = model.objects.filter(username=username).first()
            if user is None:
                user = model.objects.create_user(username=username, password=password)
            for provider in providers:  # a provider added since the last run included
                if not user.has_perm(ProviderPermission.VIEW_OPERATIONS.perm, provider):
                    role_grant(user=user, role=role, provider=provider, actor=COMMAND_LINE)

    def _next_batch(self) -> int:
        """The first batch with neither operations nor credentials: a run stopped after
        making its batch's credentials, before its first operation, used that number."""
        batch = 1
        while (
            Operation.objects.filter(key__startswith=f"demo-b{batch}-").exists()
            or Host.objects.filter(name=f"demo-fleet-b{batch}").exists()
        ):
            batch += 1
        return batch

    def _credentials(self, batch: int) -> dict[str, str]:
        """A host token for this batch's fleet and an approver token for its approvals."""
        _, host_token = host_create(name=f"demo-fleet-b{batch}")
        _, approver_token = approver_create(
            name=f"demo-phone-b{batch}",
            providers=["demo-orders", "demo-journal", "demo-payments"],
        )
        return {"SETTLE_HOST_TOKEN": host_token, "SETTLE_APPROVER_TOKEN": approver_token}

    def _lookups_wait(self, batch: int, worker: fleet.Child) -> None:
        """Wait (bounded) until the Celery worker ran the lookups this batch queued."""
        in_flight = LookupAttempt.objects.filter(
            operation__key__startswith=f"demo-b{batch}-", status__in=LOOKUP_IN_FLIGHT
        )
        deadline = time.monotonic() + LOOKUPS_TIMEOUT
        while in_flight.exists():
            if not worker.alive():
                raise CommandError(f"the Celery worker exited; see {worker.log_path}")
            if time.monotonic() > deadline:
                self.stderr.write(
                    f"{in_flight.count()} lookups still queued or running after "
                    f"{LOOKUPS_TIMEOUT:.0f} s; see {worker.log_path}"
                )
                return
            time.sleep(0.2)

    def _summary(self, batch: int, report: fleet.FleetReport) -> None:
        rows = Operation.objects.filter(key__startswith=f"demo-b{batch}-").order_by("key")
        write = self.stdout.write
        write(
            f"Batch {batch}: {len(report.finished)} workers finished, "
            f"{len(report.killed)} killed with SIGKILL, {len(report.resumed)} resumed by a "
            "replacement worker after the lease lapsed."
        )
        for operation in rows:
            write(f"  {operation.key:<40} {operation.state}")
        states = Counter(Operation.objects.values_list("state", flat=True))
        stranded = (
            Dispatch.objects.filter(receipt_status=Dispatch.ReceiptStatus.RUNNING)
            .exclude(operation__state="dispatched")
            .count()
        )
        summary = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        write(f"All batches: {summary}; {stranded} stranded receipts.")
        write("")
        write("Sign in with (DEMO PASSWORDS, for this throwaway database only):")
        for username, role, password in DEMO_USERS:
            write(f"  {username:<11} {password:<16} {role} on every demo provider")

    def _served(self, url: str, var: Path, children: list[fleet.Child]) -> None:
        self.stdout.write("")
        self.stdout.write(f"Settle is running at {url}/")
        pids = ", ".join(f"{child.name} {child.process.pid}" for child in children)
        self.stdout.write(f"  processes: {pids}; logs in {var}/log")
        self.stdout.write(
            "  The sweeper notices the dead workers and looks up the providers' evidence;"
        )
        self.stdout.write("  watch the queue settle what the evidence settles.")
        self.stdout.write("Press Ctrl-C to stop.")
