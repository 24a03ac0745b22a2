"""The PostgreSQL side of ``bench/api.py``: its scratch database, the server's settings,
and pgbench's commit rate, the floor a single client's commits sit on.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connection

from bench.api_runs import percentile
from harness.gunicorn import pg_wait_for_other_sessions

PGBENCH_SECONDS = 5


@contextlib.contextmanager
def scratch_database() -> Iterator[dict[str, Any]]:
    """Create ``bench_api_<NAME>`` on the configured server, switch to it, drop it afterwards."""
    settings: dict[str, Any] = connection.settings_dict
    settings["TEST"] = {**settings.get("TEST", {}), "NAME": f"bench_api_{settings['NAME']}"}
    original_name = connection.creation.create_test_db(
        verbosity=0, autoclobber=True, serialize=False
    )
    try:
        yield settings
    finally:
        with contextlib.suppress(Exception):
            pg_wait_for_other_sessions(connection)
        connection.close()
        connection.creation.destroy_test_db(original_name, verbosity=0)


def analyze() -> None:
    """Bring the planner's statistics up to date, as autovacuum does between runs.

    The statements are prepared (``SETTLE_DB_PREPARED_STATEMENTS``) and keep the plan
    made when the scratch tables were nearly empty until an ANALYZE replaces it. A
    server with autovacuum on (PostgreSQL's default) does this by itself as tables
    grow; one with it off (this project's test machine) never does.
    """
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def server_setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return str(cursor.fetchone()[0])


def pgbench_inserts(settings: dict[str, Any], scratch: Path) -> dict[str, float]:
    """``pgbench -n -c 1 -T 5``, one single-row INSERT per transaction; rate and latency."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_pgbench_insert (v integer)")
    script = scratch / "insert.sql"
    script.write_text("INSERT INTO bench_pgbench_insert (v) VALUES (1);\n", "utf-8")
    log_prefix = scratch / "pgbench_log"
    command = [
        "pgbench",
        "-n",
        "-c",
        "1",
        "-T",
        str(PGBENCH_SECONDS),
        "-f",
        str(script),
        "-l",
        f"--log-prefix={log_prefix}",
        "-h",
        str(settings.get("HOST") or "127.0.0.1"),
        "-p",
        str(settings.get("PORT") or 5432),
        "-U",
        str(settings.get("USER") or "postgres"),
        str(settings["NAME"]),
    ]
    env = {**os.environ}
    if settings.get("PASSWORD"):
        env["PGPASSWORD"] = str(settings["PASSWORD"])
    done = subprocess.run(
        command,
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=PGBENCH_SECONDS + 60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed: {done.stderr or done.stdout}")
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    if match is None:
        raise RuntimeError(f"cannot read pgbench's output:\n{done.stdout}")
    latencies = [
        int(line.split()[2]) / 1000
        for path in scratch.glob("pgbench_log*")
        for line in path.read_text("utf-8").splitlines()
        if line.strip()
    ]
    return {
        "tps": float(match.group(1)),
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
    }
