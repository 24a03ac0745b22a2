"""How fast a bulk confirm goes through real Celery workers (``manage.py benchmark_bulk``).

    python manage.py benchmark_bulk --operations N --workers W

Figures, not a test; a development tool, not part of a runtime install. Everything
happens in a scratch database (PostgreSQL: the ``DATABASE_URL`` database's name +
``_benchbulk``, dropped and created afresh; SQLite: a file), never the configured one.

N operations are inserted in bulk as a provider outage leaves them once its record is
back: in ``reconcile``, their host's report ``failed``, the provider's evidence a
``match`` of a committed record (so a confirm is backed). An operator submits one
confirm batch of all of them through the service the console's submit calls
(``bulk_submit``, its chunks published at its commit); W real ``celery -A settle
worker`` processes (one pool process each) do the items. Measured from the submission
until the batch is ``finished`` with every item's outcome written: items/s. The last line
is one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import current_app as celery_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import connection, connections
from django.utils import timezone

from bench.recovery import (
    DEFAULT_BROKER,
    RecoveryBenchmark,
    _cpu_seconds,
    celery_start,
    celery_stop,
)
from bulk.models import BulkBatch, BulkItem
from bulk.services import Pick, bulk_submit
from common.actors import Actor
from common.canonical import canonical_params, params_digest, sha256_digest
from recovery.models import Dispatch, Evidence, Host, Operation, Provider, State
from recovery.services.providers import provider_configure
from recovery.services.roles import role_grant, roles_ensure

BENCH = Actor.system("benchmark")


def matched_seed(*, host: Host, provider: Provider, count: int, prefix: str) -> list[Operation]:
    """``count`` operations in ``reconcile`` whose latest evidence backs a confirm.

    Inserted in bulk, as an outage leaves them: the host reported ``failed`` after its
    lease lapsed, and the provider's record, read once it was back, matches a committed
    effect. Their chains start empty: what is measured is the confirm.
    """
    now = timezone.now()
    made: list[Operation] = []
    for start in range(0, count, 2000):
        operations = []
        for n in range(start, min(count, start + 2000)):
            key = f"{prefix}-{n:06d}"
            canonical = canonical_params({"amount": n + 1, "currency": "EUR", "to": key})
            operations.append(
                Operation(
                    key=key,
                    host=host,
                    action="payment.send",
                    provider=provider,
                    params_canonical=canonical,
                    params_digest=params_digest(canonical),
                    state=State.RECONCILE,
                    version=5,
                )
            )
        created = Operation.objects.bulk_create(operations)
        if connection.vendor != "postgresql":  # no RETURNING ids in bulk on SQLite
            created = list(Operation.objects.filter(key__in=[op.key for op in operations]))
        Dispatch.objects.bulk_create(
            Dispatch(
                operation=operation,
                permit_id=uuid.uuid4(),
                fencing_token=uuid.uuid4().hex,
                worker="bench-worker",
                created_at=now,
                lease_expires_at=now - timedelta(minutes=5),
                receipt_status=Dispatch.ReceiptStatus.FAILED,
                receipt_reported_at=now,
            )
            for operation in created
        )
        Evidence.objects.bulk_create(
            Evidence(
                operation=operation,
                source=Evidence.Source.LOOKUP,
                verdict="match",
                provider_status="committed",
                provider_reference=f"r-{operation.key}",
                raw={"key": operation.key},
                raw_digest=sha256_digest(operation.key.encode()),
                captured_at=now,
            )
            for operation in created
        )
        made += created
    return made


class BulkBenchmark(RecoveryBenchmark):
    """The measurement; ``stdout`` is the command's (``manage.py benchmark_bulk``)."""

    scratch_suffix = "_benchbulk"

    def run(self, **options: Any) -> None:
        count = options["operations"]
        workers = options["workers"]
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchbulk-"))
        database_url = self._scratch_database(scratch)
        broker = os.environ.get("CELERY_BROKER_URL", DEFAULT_BROKER)
        if broker == "filesystem://":
            broker = DEFAULT_BROKER
        queue = f"settle-benchbulk-{uuid.uuid4().hex[:8]}"
        celery_app.conf.broker_url = broker
        celery_app.conf.task_default_queue = queue
        settings.CELERY_TASK_DEFAULT_QUEUE = queue
        settings.SETTLE_BULK_MAX_ITEMS = max(settings.SETTLE_BULK_MAX_ITEMS, count)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            host = Host.objects.create(name="bench-fleet", token_hash="sha256:" + uuid.uuid4().hex)
            provider, _ = provider_configure(
                name="bench-orders", adapter="journal", path=str(scratch / "j.jsonl"), actor=BENCH
            )
            operations = matched_seed(host=host, provider=provider, count=count, prefix="bulk")
            roles_ensure()
            user = get_user_model().objects.create_user("bench-operator")
            role_grant(user=user, role="operator", provider=provider, actor=BENCH)
            self._analyze()
            self.stdout.write(
                f"database {connection.vendor} ({connection.settings_dict['NAME']}), "
                f"broker {broker}, {workers} workers, {os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.1f} before the run"
            )
            procs = self._workers(scratch, workers, database_url, broker, queue)
            started = time.monotonic()
            workers_cpu_started = sum(_cpu_seconds(proc.pid) for proc in procs)
            batch = bulk_submit(
                action="confirm",
                picks=[Pick(op.pk, op.version) for op in operations],
                selection="benchmark",
                reason="provider back after the outage",
                actor=Actor.of("user", user),
            )
            submitted = time.monotonic() - started
            deadline = started + options["timeout"]
            while BulkBatch.objects.filter(pk=batch.pk, status="running").exists():
                if time.monotonic() > deadline:
                    raise CommandError(f"timed out: {self._settled(batch)} of {count} settled")
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            workers_cpu = sum(_cpu_seconds(proc.pid) for proc in procs) - workers_cpu_started
            batch.refresh_from_db()
            released = Operation.objects.filter(provider=provider, state=State.RELEASED).count()
            report = BulkItem.objects.filter(batch=batch).exclude(status="pending").count()
        finally:
            celery_stop(procs)
            connections.close_all()
            with celery_app.connection_for_write() as channel_owner:
                channel_owner.default_channel.queue_delete(queue)
            if not options["keep"]:
                shutil.rmtree(scratch, ignore_errors=True)
        figures = {
            "operations": count,
            "workers": workers,
            "elapsed_s": round(elapsed, 3),
            "items_per_s": round(count / elapsed, 1),
            "submit_s": round(submitted, 3),
            "done": batch.done_count,
            "refused": batch.refused_count,
            "released": released,
            "report_complete": report == count,
            "workers_cpu_s": round(workers_cpu, 2),
        }
        self.stdout.write(
            f"bulk confirm of {count} matched operations, {workers} workers: "
            f"{figures['items_per_s']:.0f} items/s ({elapsed:.1f} s; submission "
            f"{submitted * 1000:.0f} ms); {batch.done_count} done, {batch.refused_count} "
            f"refused, {released} released; report complete: {figures['report_complete']}"
        )
        self.stdout.write(json.dumps({"bulk_confirm": figures}))

    def _settled(self, batch: BulkBatch) -> int:
        return BulkItem.objects.filter(batch=batch).exclude(status="pending").count()

    def _workers(
        self, scratch: Path, workers: int, database_url: str, broker: str, queue: str
    ) -> list[subprocess.Popen[bytes]]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "settle.settings",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": broker,
            "SETTLE_CELERY_QUEUE": queue,
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
        }
        procs = []
        logs = []
        for n in range(workers):
            log = scratch / f"worker-{n}.log"
            logs.append(log)
            procs.append(celery_start("worker", name=f"benchbulk{n}", log=log, env=env))
        self._workers_ready(procs, logs)
        return procs
