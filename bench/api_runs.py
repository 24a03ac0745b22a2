"""The runs of ``bench/api.py``: a fleet of client processes against gunicorn, the request
floor, and what each measured.
"""

from __future__ import annotations

import http.client
import math
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.api_cpu import CpuMeter, machine_cpu
from harness.fleet.run import FleetSpec, fleet_run
from harness.gunicorn import GunicornServer

SQL_PASS_SECONDS = 3.0
WARM_UP_SECONDS = 1.5


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Run:
    """What one fleet run measured: calls, lifecycles, wall time, errors."""

    def __init__(self, clients: int, results: list[dict[str, Any]]) -> None:
        self.clients = clients
        self.failed = [r for r in results if "error" in r]
        finished = [r for r in results if "error" not in r]
        self.calls = [call for r in finished for call in r["calls"]]
        self.lifecycles = sum(int(r["lifecycles"]) for r in finished)
        self.seconds = (
            max(r["finished"] for r in finished) - min(r["started"] for r in finished)
            if finished
            else math.nan
        )
        self.cpu = (math.nan, math.nan)  # CPU seconds of gunicorn's workers, of PostgreSQL
        # CPU seconds the client processes themselves spent in their loops.
        self.client_cpu = sum(float(r.get("cpu", math.nan)) for r in finished)
        self.machine_busy = math.nan  # share of the machine's CPU time that was busy
        self.machine_seconds = math.nan  # busy CPU seconds of the whole machine
        self.errors = Counter(
            f"{status} {code}" for _, status, code, *_ in self.calls if not 200 <= status < 300
        )

    def rest_cpu(self) -> float:
        """Busy CPU seconds of the machine outside the workers, backends and clients.

        The kernel's network work, gunicorn's master, this script, anything else.
        """
        return self.machine_seconds - self.cpu[0] - self.cpu[1] - self.client_cpu

    def latencies(self, endpoint: str | None = None) -> list[float]:
        return [c[3] for c in self.calls if endpoint is None or c[0] == endpoint]

    def cpu_ms(self, endpoint: str) -> float:
        """Median CPU ms of the worker's thread per request (the SQL pass's header)."""
        values = [c[6] for c in self.calls if c[0] == endpoint and len(c) > 6 and c[6] is not None]
        return statistics.median(values) if values else math.nan

    def sql(self, endpoint: str) -> tuple[float, float, int]:
        """Median statements, median transactions and the maximum statements seen."""
        rows = [(c[4], c[5]) for c in self.calls if c[0] == endpoint and c[4] is not None]
        if not rows:
            return math.nan, math.nan, 0
        return (
            statistics.median(r[0] for r in rows),
            statistics.median(r[1] for r in rows),
            max(r[0] for r in rows),
        )


def fleet(
    server: GunicornServer,
    tokens: tuple[str, str],
    provider: dict[str, Any],
    count: int,
    seconds: float,
    tag: str,
    scratch: Path,
    role: str = "lifecycle",
) -> Run:
    specs = [FleetSpec(f"{tag}-{i}", role, [provider]) for i in range(count)]
    meters: list[Any] = []

    def start_meters() -> None:  # once the clients have started up, as they are released
        meters[:] = [CpuMeter(server.process.pid), machine_cpu()]

    results = fleet_run(
        url=server.url,
        host_token=tokens[0],
        approver_token=tokens[1],
        clients=specs,
        seconds=seconds,
        directory=scratch / tag,
        on_go=start_meters,
    )
    meter, (busy_before, total_before) = meters
    run = Run(count, results)
    busy, total = machine_cpu()
    run.cpu = meter.used()
    if total > total_before:
        run.machine_busy = (busy - busy_before) / (total - total_before)
        run.machine_seconds = (busy - busy_before) / os.sysconf("SC_CLK_TCK")
    return run


FLOOR_REQUESTS = 2000


def request_floor(server: GunicornServer) -> tuple[float, float]:
    """What a request costs gunicorn and Django with no work behind it.

    ``FLOOR_REQUESTS`` unauthenticated API requests (401 before any SQL), each on a
    connection of its own as the fleet's are, from 4 threads: ``(gunicorn CPU ms per
    request, requests per second)``. What a lifecycle's request costs beyond this is
    the services' own work.
    """
    meter = CpuMeter(server.process.pid)
    host, port = "127.0.0.1", server.port

    def send(count: int) -> None:
        for _ in range(count):
            connection = http.client.HTTPConnection(host, port, timeout=10)
            try:
                connection.request("GET", "/api/v1/operations/floor")
                connection.getresponse().read()
            finally:
                connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=send, args=(FLOOR_REQUESTS // 4,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    gunicorn_seconds, _ = meter.used()
    return gunicorn_seconds / FLOOR_REQUESTS * 1000, FLOOR_REQUESTS / elapsed
