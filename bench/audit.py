"""Verifying a large audit log (``manage.py benchmark_audit``).

    python manage.py benchmark_audit --events N [--new 10000] [--reuse]

Figures, not a test. Seeds N audit events (``bench.seed.seed_audit``: valid chains of
four) into the configured database, which must hold none (``--reuse`` measures the log
an earlier run left), then measures, each in a process of its own so that its peak
memory is its own:

first checkpoint
    ``audit_checkpoint`` over the whole log, signed ten minutes in the past (as if the
    log had been checkpointed all along), in this process.
routine checkpoint
    ``manage.py audit_checkpoint`` after ``--new`` more events: it reads only what is
    new since the last checkpoint.
full verification
    ``manage.py verify_audit --no-checkpoint``: every event of every chain, every
    checkpoint.

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
from datetime import timedelta
from pathlib import Path
from typing import Any

import time_machine
from django.conf import settings
from django.core.management.base import CommandError, OutputWrapper
from django.test.utils import override_settings
from django.utils import timezone

from bench import seed
from recovery.audit import audit_checkpoint
from recovery.models import AuditCheckpoint, AuditEvent

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


# Runs manage.py and prints, last, the seconds from the end of django.setup() to its exit
# (the command's own work: the rest of the wall time is starting Python and Django) and
# its own peak resident memory. Not the rusage the parent gets from wait4: Linux carries
# a process's high-water mark across fork and exec, so a child of this (large, seeding)
# process would report this process's peak.
_PEAK_REPORTING = (
    "import atexit, runpy, sys, time\n"
    "import django\n"
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

    def run(self, *, events: int, new: int = 10_000, reuse: bool = False) -> dict[str, Any]:
        existing = AuditEvent.objects.count()
        if existing and not reuse:
            raise CommandError(
                f"this database already holds {existing} audit events: benchmark_audit seeds "
                "its own. Point DATABASE_URL at an empty database, or pass --reuse."
            )
        figures: dict[str, Any] = {"events": existing or events}
        with tempfile.TemporaryDirectory(prefix="settle-bench-audit-") as scratch:
            checkpoints = Path(scratch) / "checkpoints.jsonl"
            if reuse and AuditCheckpoint.objects.exists():
                raise CommandError("--reuse needs a log without checkpoints (run on a fresh seed)")
            with override_settings(SETTLE_AUDIT_CHECKPOINT_FILE=checkpoints):
                figures.update(self._seed_and_checkpoint(events if not existing else 0))
            env = {
                **os.environ,
                "SETTLE_AUDIT_CHECKPOINT_FILE": str(checkpoints),
                "SETTLE_AUDIT_KEY": settings.SETTLE_AUDIT_KEY,
            }
            began = time.perf_counter()
            seed.seed_audit(new)
            self.stdout.write(f"{new} new events in {time.perf_counter() - began:.1f} s")
            routine = _measured(["audit_checkpoint"], env)
            figures["routine_checkpoint"] = {"new_events": new, **routine}
            self.stdout.write(f"routine checkpoint: {routine}")
            full = _measured(["verify_audit", "--no-checkpoint"], env)
            figures["full_verify"] = {"events": AuditEvent.objects.count(), **full}
            self.stdout.write(f"full verification: {full}")
        self.stdout.write(json.dumps(figures))
        return figures

    def _seed_and_checkpoint(self, events: int) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        if events:
            began = time.perf_counter()
            seed.seed_audit(events)
            figures["seed_seconds"] = round(time.perf_counter() - began, 1)
            self.stdout.write(f"seeded {events} events in {figures['seed_seconds']} s")
        # Ten minutes ago: the routine checkpoint then rescans from this one's watermark,
        # as it does when checkpoints run every minute (CHECKPOINT_RESCAN).
        began = time.perf_counter()
        with time_machine.travel(timezone.now() - timedelta(minutes=10), tick=True):
            audit_checkpoint()
        figures["first_checkpoint_seconds"] = round(time.perf_counter() - began, 1)
        self.stdout.write(f"first checkpoint in {figures['first_checkpoint_seconds']} s")
        return figures
