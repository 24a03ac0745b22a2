"""How fast background recovery drains a crash storm (``manage.py benchmark_recovery``).

    python manage.py benchmark_recovery --operations N --workers W [--resume-operations M]

Figures, not a test; a development tool, not part of a runtime install (the command
only passes its options here). The figures and how they were reached are in
``docs/benchmarks.md``. Everything happens in a scratch database (PostgreSQL: the
``DATABASE_URL`` database's name + ``_benchrec``, dropped and created afresh; SQLite: a
file) and a scratch directory, never in the configured database.

The stranded operations are inserted in bulk, as the fleet would have left them:
dispatched, receipt ``running``, their provider's journal holding one committed line
for each. Their chains start at the lease loss (no registration events): the benchmark
measures recovery, not registration.

background
    W real ``celery -A settle worker`` processes (one pool process each); every lease
    lapses at one moment; the command then runs beat's ``sweep`` task body in a loop,
    which publishes the lookups exactly as beat's sweep does. Measured until the last
    operation is ``released``.
one at a time
    The same number of operations on a second journal of the same size, each settled
    one after the other in this process as a host's resume settles it: ``resume``
    queues its lookup, the single-attempt task's body runs it (``lookup_attempt_run``,
    what a worker does for one message), ``resume`` again answers ``released``.

SQL statements are counted with ``bench.sqlcount`` in every process that touches the
database for recovery: the workers' pool processes and this process's sweeps (not the
command's own progress polling).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import current_app as celery_app
from django.conf import settings
from django.core.management.base import CommandError, OutputWrapper
from django.db import connection, connections
from django.db.models.functions import Now
from django.utils import timezone

from bench.scratch import scratch_database_use
from bench.sqlcount import StatementCount, count_files_total, counting
from common.actors import Actor
from common.canonical import canonical_dumps, canonical_params, params_digest, sha256_digest
from recovery.models import Dispatch, Host, LookupAttempt, Operation, Provider, State
from recovery.services.providers import provider_configure

BENCH = Actor.system("benchmark")
DEFAULT_BROKER = "redis://127.0.0.1:6379/6"


def _journal_line(seq: int, key: str, digest: str) -> bytes:
    record: dict[str, Any] = {
        "seq": seq,
        "operation_key": key,
        "params_digest": digest,
        "reference": f"ref-{key}",
        "status": "committed",
        "committed_at": "2026-01-01T00:00:00Z",
    }
    record["checksum"] = sha256_digest(canonical_dumps(record))
    return canonical_dumps(record) + b"\n"


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(len(ordered) * fraction) - 1))]


class RecoveryBenchmark:
    """The measurement; ``stdout`` is the command's (``manage.py benchmark_recovery``)."""

    scratch_suffix = "_benchrec"  # the scratch database: the configured one's name + this

    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout

    def run(self, **options: Any) -> None:
        """``options``: the command's (``operations``, ``workers``, ``resume_operations``,
        ``timeout``, ``keep``)."""
        count = options["operations"]
        workers = options["workers"]
        resumed = options["resume_operations"] or count
        scratch = Path(tempfile.mkdtemp(prefix="settle-benchrec-"))
        database_url = self._scratch_database(scratch)
        broker = os.environ.get("CELERY_BROKER_URL", DEFAULT_BROKER)
        if broker == "filesystem://":
            broker = DEFAULT_BROKER
        queue = f"settle-benchrec-{uuid.uuid4().hex[:8]}"
        celery_app.conf.broker_url = broker
        celery_app.conf.task_default_queue = queue
        settings.CELERY_TASK_DEFAULT_QUEUE = queue  # where resume publishes its lookups
        try:
            background, one_by_one = self._providers(scratch, count, resumed)
            self._analyze()
            self.stdout.write(
                f"database {connection.vendor} ({connection.settings_dict['NAME']}), "
                f"broker {broker}, {workers} workers, {os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.1f} before the run"
            )
            figures = self._background(
                scratch, background, count, workers, database_url, broker, queue, options
            )
            self._print("background (sweep + Celery workers)", figures)
            slow = self._one_at_a_time(one_by_one, resumed)
            self._print("one at a time (resume)", slow)
            self.stdout.write(f"speed-up: {figures['rate'] / slow['rate']:.1f}x")
        finally:
            connections.close_all()
            with celery_app.connection_for_write() as channel_owner:
                channel_owner.default_channel.queue_delete(queue)  # and resume's leftover messages
            if not options["keep"]:
                shutil.rmtree(scratch, ignore_errors=True)

    # -- set-up ---------------------------------------------------------------------

    def _scratch_database(self, scratch: Path) -> str:
        """Point this process at a fresh scratch database; its URL, for the workers."""
        return scratch_database_use(scratch, self.scratch_suffix)

    def _providers(self, scratch: Path, count: int, resumed: int) -> tuple[Provider, Provider]:
        host = Host.objects.create(name="bench-fleet", token_hash="sha256:" + uuid.uuid4().hex)
        made = []
        # The resume journal is as long as the background one, however many are resumed.
        for name, size in (("bench-background", count), ("bench-resume", resumed)):
            journal = scratch / f"{name}.jsonl"
            provider, _ = provider_configure(
                name=name, adapter="journal", path=str(journal), lease_seconds=60, actor=BENCH
            )
            self._stranded(host, provider, journal, size, lines=max(size, count))
            made.append(provider)
        return made[0], made[1]

    def _stranded(
        self, host: Host, provider: Provider, journal: Path, size: int, *, lines: int
    ) -> None:
        """``size`` dispatched operations with running receipts; ``lines`` journal lines.

        Lines beyond ``size`` are committed effects of operations settled long ago.
        """
        now = timezone.now()
        later = now + timedelta(days=1)  # the leases lapse when the measurement starts
        with open(journal, "wb") as handle:
            for start in range(0, lines, 2000):
                operations = []
                written = []
                for n in range(start, min(lines, start + 2000)):
                    key = f"{provider.name}-{n:06d}"
                    canonical = canonical_params({"amount": n + 1, "currency": "EUR", "to": key})
                    digest = params_digest(canonical)
                    written.append(_journal_line(n + 1, key, digest))
                    if n >= size:
                        continue
                    operations.append(
                        Operation(
                            key=key,
                            host=host,
                            action="payment.send",
                            provider=provider,
                            params_canonical=canonical,
                            params_digest=digest,
                            state=State.DISPATCHED,
                            version=3,
                        )
                    )
                handle.writelines(written)
                if not operations:
                    continue
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
                        lease_expires_at=later,
                    )
                    for operation in created
                )

    def _analyze(self) -> None:
        """Give the planner statistics of the tables as filled, as a running database has.

        Without them it plans the sweep's queries for the empty tables it last saw (a
        nested loop over every row: seconds per batch at N = 10,000) until autovacuum
        happens to analyze them mid-run: that would measure autovacuum's timing.
        """
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")

    def _leases_lapse(self, provider: Provider) -> None:
        Dispatch.objects.filter(operation__provider=provider).update(lease_expires_at=Now())

    # -- the two runs ------------------------------------------------------------------

    def _background(
        self,
        scratch: Path,
        provider: Provider,
        count: int,
        workers: int,
        database_url: str,
        broker: str,
        queue: str,
        options: dict[str, Any],
    ) -> dict[str, float]:
        from recovery.tasks import sweep as sweep_task

        counts = scratch / "sql"
        counts.mkdir()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "settle.settings",
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": broker,
            "SETTLE_CELERY_QUEUE": queue,
            "SETTLE_SQL_COUNT_DIR": str(counts),
            "SETTLE_AUDIT_CHECKPOINT_FILE": str(scratch / "checkpoints.jsonl"),
        }
        procs = []
        logs = []
        try:
            for n in range(workers):
                log = scratch / f"worker-{n}.log"
                logs.append(log)
                procs.append(celery_start("worker", name=f"bench{n}", log=log, env=env))
            self._workers_ready(procs, logs)
            sweeps = StatementCount()
            self._leases_lapse(provider)
            started = time.monotonic()
            cpu_started = time.process_time()
            workers_cpu_started = sum(_cpu_seconds(proc.pid) for proc in procs)
            database_cpu_started = _database_cpu_seconds()
            sweeping = 0.0
            deadline = started + options["timeout"]
            released = 0
            while released < count:
                if time.monotonic() > deadline:
                    raise CommandError(f"timed out: {released} of {count} released")
                sweep_started = time.monotonic()
                with _Counting(sweeps):
                    outcome = sweep_task()
                sweeping += time.monotonic() - sweep_started
                if not outcome["leases_lapsed"] and not outcome["lookups_queued"]:
                    time.sleep(0.1)
                released = Operation.objects.filter(provider=provider, state=State.RELEASED).count()
            elapsed = time.monotonic() - started
            cpu = time.process_time() - cpu_started
            workers_cpu = sum(_cpu_seconds(proc.pid) for proc in procs) - workers_cpu_started
            database_cpu = _database_cpu_seconds() - database_cpu_started
            time.sleep(1.0)  # the last task's count file is written after it returns
            in_workers = count_files_total(counts)
        finally:
            celery_stop(procs)
        figures = self._latencies(provider, count, elapsed)
        figures["sql"] = (sweeps.total + in_workers.total) / count
        figures["sql_sweep"] = sweeps.total / count
        figures["sql_workers"] = in_workers.total / count
        figures["commits"] = (sweeps.commit + in_workers.commit) / count
        figures["sweeping_s"] = sweeping
        figures["sweeper_cpu_s"] = cpu
        figures["workers_cpu_s"] = workers_cpu
        figures["database_cpu_s"] = database_cpu
        return figures

    def _workers_ready(self, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
        """Wait until every worker consumes: ping them through the broker."""
        deadline = time.monotonic() + 60
        while True:
            for proc, log in zip(procs, logs, strict=True):
                if proc.poll() is not None:
                    raise CommandError(f"a worker exited:\n{log.read_text()[-3000:]}")
            replies = celery_app.control.ping(timeout=1.0) or []
            if len(replies) >= len(procs):
                return
            if time.monotonic() > deadline:
                raise CommandError("the workers did not start in 60 s")

    def _one_at_a_time(self, provider: Provider, count: int) -> dict[str, float]:
        from recovery.services.lookup_tasks import lookup_attempt_run
        from recovery.services.resume import operation_resume

        actor = Actor("host", "1", "bench-fleet")
        operations = list(Operation.objects.filter(provider=provider).select_related("provider"))
        statements = StatementCount()
        self._leases_lapse(provider)
        started = time.monotonic()
        for operation in operations:
            with _Counting(statements):
                queued = operation_resume(operation=operation, worker="bench", actor=actor)
            if queued.decision != "in_progress":
                raise CommandError(f"{operation.key}: resume queued no lookup: {queued}")
            # The attempt's id, which the task's message carries (not counted).
            attempt = LookupAttempt.objects.get(operation=operation)
            with _Counting(statements):
                lookup_attempt_run(attempt_id=attempt.pk)
                outcome = operation_resume(operation=operation, worker="bench", actor=actor)
            if outcome.state != State.RELEASED:
                raise CommandError(f"{operation.key} was not released: {outcome}")
        elapsed = time.monotonic() - started
        figures = self._latencies(provider, count, elapsed)
        figures["sql"] = statements.total / count
        figures["sql_sweep"] = 0.0
        figures["sql_workers"] = 0.0
        figures["commits"] = statements.commit / count
        return figures

    def _latencies(self, provider: Provider, count: int, elapsed: float) -> dict[str, float]:
        """Lost lease → ``released``, per operation, from the rows themselves."""
        rows = Operation.objects.filter(provider=provider, state=State.RELEASED).values_list(
            "updated_at", "dispatch__lease_expires_at"
        )
        waits = sorted((released - lapsed).total_seconds() for released, lapsed in rows)
        return {
            "count": float(count),
            "elapsed": elapsed,
            "rate": count / elapsed,
            "p50": statistics.median(waits),
            "p95": _percentile(waits, 0.95),
        }

    def _database_cpu(self, figures: dict[str, float]) -> str:
        if connection.vendor != "postgresql":
            return "the database in those processes (SQLite)"
        if figures["database_cpu_s"] < 0:
            return "PostgreSQL not measured (its processes are not readable here)"
        return f"PostgreSQL backends {figures['database_cpu_s']:.1f} s"

    def _print(self, title: str, figures: dict[str, float]) -> None:
        if "sweeping_s" in figures:
            self.stdout.write(
                f"  where the time went: sweeping {figures['sweeping_s']:.1f} s of the wall "
                f"time; CPU: sweeping process {figures['sweeper_cpu_s']:.1f} s, worker "
                f"processes {figures['workers_cpu_s']:.1f} s, {self._database_cpu(figures)}"
            )
        self.stdout.write(
            f"{title}: {int(figures['count'])} released in {figures['elapsed']:.1f} s = "
            f"{figures['rate']:.0f} operations/s; lost lease → released p50 "
            f"{figures['p50']:.2f} s, p95 {figures['p95']:.2f} s; SQL statements per "
            f"settled operation {figures['sql']:.1f} (sweeps {figures['sql_sweep']:.1f}, "
            f"workers {figures['sql_workers']:.1f}; commits {figures['commits']:.2f})"
        )
        self.stdout.write(json.dumps({title: {k: round(v, 3) for k, v in figures.items()}}))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its children (a worker and its pool process)."""
    total = 0.0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _database_cpu_seconds() -> float:
    """User + system CPU of the PostgreSQL backends connected to this database, so far.

    The backends of the sweeping process (this one) and of the workers' pool processes;
    they live as long as their connections (``CONN_MAX_AGE``), so a difference of two
    readings is what the database spent on them meanwhile. -1 where unreadable (not
    PostgreSQL, or the server on another machine).
    """
    if connection.vendor != "postgresql":
        return -1.0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        pids = [int(pid) for (pid,) in cursor.fetchall()]
    if not all(Path(f"/proc/{pid}/stat").exists() for pid in pids):
        return -1.0
    return sum(_cpu_seconds(pid) for pid in pids)


class _Counting:
    """Add this thread's statements inside the ``with`` block to ``count``."""

    sink: StatementCount | None = None

    def __init__(self, count: StatementCount) -> None:
        self.count = count
        if _Counting.sink is None:
            _Counting.sink = StatementCount()
            counting(_Counting.sink)
        self.before = StatementCount()

    def __enter__(self) -> None:
        assert _Counting.sink is not None
        sink = _Counting.sink
        self.before = StatementCount(sink.statements, sink.begin, sink.commit, sink.rollback)

    def __exit__(self, *exc: object) -> None:
        sink = _Counting.sink
        assert sink is not None
        self.count.statements += sink.statements - self.before.statements
        self.count.begin += sink.begin - self.before.begin
        self.count.commit += sink.commit - self.before.commit
        self.count.rollback += sink.rollback - self.before.rollback


def celery_start(
    kind: str, *, name: str, log: Path, env: dict[str, str], queues: str = ""
) -> subprocess.Popen[bytes]:
    """A Celery ``worker`` (one prefork process, named ``name``; ``queues``: its ``-Q``, the
    default queue without) or ``beat`` of the benchmarks, in a session of its own,
    writing to ``log``."""
    celery = str(Path(sys.executable).with_name("celery"))
    if not Path(celery).exists():
        celery = shutil.which("celery") or "celery"
    if kind == "beat":
        schedule = str(log.with_name("celerybeat-schedule"))
        command = [celery, "-A", "settle", "beat", "-l", "warning", "-s", schedule]
    else:
        command = [
            *(celery, "-A", "settle", "worker", "-l", "warning", "-P", "prefork"),
            *("-c", "1", "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            *(("-Q", queues) if queues else ()),
        ]
    with open(log, "wb") as handle:
        return subprocess.Popen(
            command,
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=handle,
            start_new_session=True,
        )


def celery_stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop what ``celery_start`` started: TERM to all, then KILL the session of any
    that has not exited in 20 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
