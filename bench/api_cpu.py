"""CPU time, read from ``/proc`` (Linux): gunicorn's workers, the scratch database's
PostgreSQL backends, and the whole machine.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from django.db import connection


def process_cpu(pids: set[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process in ``pids`` used so far (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def server_pids(master: int) -> tuple[set[int], set[int]]:
    """gunicorn's workers (children of ``master``) and the scratch database's backends."""
    workers = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text("ascii", "replace").rpartition(")")[2].split()[1]) == master:
                workers.add(int(stat.parent.name))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        backends = {int(row[0]) for row in cursor.fetchall()}
    return workers, backends


class CpuMeter:
    """CPU used by gunicorn's workers and by PostgreSQL's backends during one run."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.workers, self.backends = server_pids(master)
        self.before = process_cpu(self.workers | self.backends)

    def used(self) -> tuple[float, float]:
        """``(gunicorn seconds, PostgreSQL seconds)`` since this meter was made."""
        workers, backends = server_pids(self.master)
        workers |= self.workers
        backends |= self.backends
        now = process_cpu(workers | backends)

        def spent(pids: set[int]) -> float:
            return sum(now[pid] - self.before.get(pid, 0.0) for pid in pids if pid in now)

        return spent(workers), spent(backends)


def machine_cpu() -> tuple[int, int]:
    """``(busy, total)`` jiffies of the whole machine so far, from /proc/stat (Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(n) for n in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)
