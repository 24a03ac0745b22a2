"""Verifying a large audit log (``manage.py benchmark_audit``).

    python manage.py benchmark_audit --events N [--new 10000] [--backlog 1000000]
        [--reuse] [--no-one-go]

Figures, not a test. Seeds N audit events (``bench.seed.seed_audit``: valid chains of
four) into the configured database, which must hold none (``--reuse`` measures the log
an earlier run left), then measures, each in a process of its own so that its peak
memory is its own:

first checkpoint
    ``manage.py audit_checkpoint`` over the whole log (a backlog of N events), signed
    ten minutes in the past (as if the log had been checkpointed all along).
full job
    ``manage.py verify_audit --full-slice`` until the job finishes: its slices (the
    checkpoints; ``SETTLE_AUDIT_VERIFY_SLICE_EVENTS`` events each; the last checks),
    each slice's time and peak memory, and their total.
routine checkpoint
    ``manage.py audit_checkpoint`` after ``--new`` more events: it reads only what is
    new since the last checkpoint.
routine verification
    ``manage.py verify_audit --routine``: what that checkpoint signed (beat's hourly
    task).
backlog checkpoint
    ``manage.py audit_checkpoint`` after ``--backlog`` more events (a beat outage), and
    the routine verification after it.
full verification
    ``manage.py verify_audit --no-checkpoint``: every event of every chain, every
    checkpoint, in one go (not with ``--no-one-go``).

Each child's ``seconds`` is its wall time; ``work_seconds`` the part after Django had
started (the command itself), ``startup_seconds`` the rest (Python, Django, imports).

Checkpoints go to a scratch file, never to the configured one. The last line is one
JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, OutputWrapper

from audit.models import AuditCheckpoint, AuditEvent, AuditVerification
from bench import seed

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


# Runs manage.py and prints, last, the seconds from the end of django.setup() to its exit
# (the command's own work: the rest of the wall time is starting Python and Django) and
# its own peak resident memory. Not the rusage the parent gets from wait4: Linux carries
# a process's high-water mark across fork and exec, so a child of this (large, seeding)
# process would report this process's peak.
_PEAK_REPORTING = (
    "import atexit, os, runpy, sys, time\n"
    "import django\n"
    "if os.environ.get('SETTLE_BENCH_PAST_SECONDS'):\n"
    "    import datetime, time_machine\n"
    "    past = datetime.timedelta(seconds=int(os.environ['SETTLE_BENCH_PAST_SECONDS']))\n"
    "    time_machine.travel(datetime.datetime.now(datetime.UTC) - past, tick=True).start()\n"
    "ready = []\n"
    "_setup = django.setup\n"
    "def setup(*args, **kwargs):\n"
    "    _setup(*args, **kwargs)\n"
    "    ready.append(time.perf_counter())\n"
    "django.setup = setup\n"
    "def peak():\n"
    "    if ready:\n"
    "        print('WORK_S', time.perf_counter() - ready[0], flush=True)\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            print('PEAK_KB', line.split()[1], flush=True)\n"
    "atexit.register(peak)\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _measured(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``manage.py *args`` to its end: seconds (wall, and the command's own after
    Django started), its peak resident memory (MB), its output."""
    began = time.perf_counter()
    finished = subprocess.run(
        [sys.executable, "-c", _PEAK_REPORTING, str(MANAGE), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - began
    lines = finished.stdout.strip().splitlines()
    if (
        finished.returncode != 0
        or len(lines) < 2
        or not lines[-1].startswith("PEAK_KB ")
        or not lines[-2].startswith("WORK_S ")
    ):
        raise CommandError(f"manage.py {' '.join(args)} failed:\n{finished.stdout}")
    work = float(lines[-2].split()[1])
    return {
        "seconds": round(seconds, 2),
        "work_seconds": round(work, 2),
        "startup_seconds": round(seconds - work, 2),
        "peak_mb": round(int(lines[-1].split()[1]) / 1024, 1),
        "output": lines[-3] if len(lines) > 2 else "",
    }


class AuditBenchmark:
    def __init__(self, stdout: OutputWrapper) -> None:
        self.stdout = stdout

    def run(
        self,
        *,
        events: int,
        new: int = 10_000,
        backlog: int = 0,
        reuse: bool = False,
        one_go: bool = True,
    ) -> dict[str, Any]:
        existing = AuditEvent.objects.count()
        if existing and not reuse:
            raise CommandError(
                f"this database already holds {existing} audit events: benchmark_audit seeds "
                "its own. Point DATABASE_URL at an empty database, or pass --reuse."
            )
        if reuse and (AuditCheckpoint.objects.exists() or AuditVerification.objects.exists()):
            raise CommandError("--reuse needs a log without checkpoints (run on a fresh seed)")
        figures: dict[str, Any] = {"events": existing or events}
        if not existing:
            began = time.perf_counter()
            seed.seed_audit(events)
            figures["seed_seconds"] = round(time.perf_counter() - began, 1)
            self.stdout.write(f"seeded {events} events in {figures['seed_seconds']} s")
        with tempfile.TemporaryDirectory(prefix="settle-bench-audit-") as scratch:
            checkpoints = Path(scratch) / "checkpoints.jsonl"
            env = {
                **os.environ,
                "SETTLE_AUDIT_CHECKPOINT_FILE": str(checkpoints),
                "SETTLE_AUDIT_KEY": settings.SETTLE_AUDIT_KEY,
            }
            # Ten minutes ago: the routine checkpoint then rescans from this one's
            # watermark, as it does when checkpoints run every minute (CHECKPOINT_RESCAN).
            first = _measured(["audit_checkpoint"], {**env, "SETTLE_BENCH_PAST_SECONDS": "600"})
            figures["first_checkpoint"] = {"backlog_events": figures["events"], **first}
            self.stdout.write(f"first checkpoint: {first}")
            figures["full_job"] = self._full_job(env)
            self._seeded(new)
            routine = _measured(["audit_checkpoint"], env)
            figures["routine_checkpoint"] = {"new_events": new, **routine}
            self.stdout.write(f"routine checkpoint: {routine}")
            verified = _measured(["verify_audit", "--routine"], env)
            figures["routine_verify"] = {"new_events": new, **verified}
            self.stdout.write(f"routine verification: {verified}")
            if backlog:
                self._seeded(backlog)
                after = _measured(["audit_checkpoint"], env)
                figures["backlog_checkpoint"] = {"backlog_events": backlog, **after}
                self.stdout.write(f"backlog checkpoint: {after}")
                verified = _measured(["verify_audit", "--routine"], env)
                figures["routine_verify_after_backlog"] = {"new_events": backlog, **verified}
                self.stdout.write(f"routine verification after the backlog: {verified}")
            if one_go:
                full = _measured(["verify_audit", "--no-checkpoint"], env)
                figures["full_verify"] = {"events": AuditEvent.objects.count(), **full}
                self.stdout.write(f"full verification: {full}")
        self.stdout.write(json.dumps(figures))
        return figures

    def _seeded(self, count: int) -> None:
        began = time.perf_counter()
        seed.seed_audit(count)
        self.stdout.write(f"{count} new events in {time.perf_counter() - began:.1f} s")

    def _full_job(self, env: dict[str, str]) -> dict[str, Any]:
        """``verify_audit --full-slice`` until the job finishes: every slice measured."""
        slices: list[dict[str, Any]] = []
        while True:
            step = _measured(["verify_audit", "--full-slice"], env)
            slices.append(step)
            self.stdout.write(f"full job slice {len(slices)}: {step}")
            if "finished" in step["output"] or len(slices) > 1000:
                break
        return {
            "slices": len(slices),
            "seconds": round(sum(step["seconds"] for step in slices), 2),
            "work_seconds": round(sum(step["work_seconds"] for step in slices), 2),
            "slowest_slice_seconds": max(step["seconds"] for step in slices),
            "peak_mb": max(step["peak_mb"] for step in slices),
            "output": slices[-1]["output"],
        }
