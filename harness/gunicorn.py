"""Run Settle under gunicorn the way production does, for the soak test and bench/api.py.

docs/deploying.md's production line is ``gunicorn -c python:settle.gunicorn_conf
settle.wsgi -w 4 -b 127.0.0.1:8000``; this runs that command without the ``-c`` config,
which only tidies the metrics directory (with a free port, and optionally another WSGI
module such as ``bench.counting_wsgi``) from the repository root, with ``DATABASE_URL``
pointing at the database the caller chose::

    server = gunicorn_start(database_url=url, log_path=tmp / "gunicorn.log")
    try:
        ...  # talk to server.url over HTTP
    finally:
        gunicorn_stop(server)

or ``with gunicorn_running(database_url=url, log_path=...) as server: ...``.

gunicorn runs in a session (process group) of its own, so stopping it reaps the master
and its workers together: SIGTERM (graceful) first, SIGKILL to the group if the master is
not gone within ``stop_timeout``. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.celery_procs import child_environment
from harness.processes import process_stop
from harness.providers import _free_port
from settle.gunicorn_conf import approval_waits

REPO_ROOT = Path(__file__).resolve().parents[1]
# A local server: never through a proxy from the environment.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class GunicornServer:
    """A running gunicorn master (its workers are in the same process group)."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    command: list[str]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_tail(self, size: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text("utf-8", "replace")[-size:]
        return ""


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A ``postgres://`` URL for a Django PostgreSQL ``settings_dict`` (its current NAME)."""
    user = urllib.parse.quote(str(settings_dict.get("USER") or ""), safe="")
    password = str(settings_dict.get("PASSWORD") or "")
    credentials = user + (":" + urllib.parse.quote(password, safe="") if password else "")
    host = str(settings_dict.get("HOST") or "127.0.0.1")
    port = str(settings_dict.get("PORT") or "5432")
    name = urllib.parse.quote(str(settings_dict["NAME"]), safe="")
    return f"postgres://{credentials + '@' if credentials else ''}{host}:{port}/{name}"


def gunicorn_executable() -> str:
    """The venv's gunicorn (next to this interpreter), else the one on PATH."""
    beside = Path(sys.executable).with_name("gunicorn")
    if beside.exists():
        return str(beside)
    found = shutil.which("gunicorn")
    if found is None:
        raise RuntimeError("gunicorn is not installed (pip install gunicorn)")
    return found


def _healthy(url: str) -> bool:
    try:
        with _LOCAL.open(url + "/healthz", timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def gunicorn_start(
    *,
    database_url: str,
    log_path: Path,
    app: str = "settle.wsgi",
    workers: int = 4,
    threads: int = 1,
    env: Mapping[str, str | None] | None = None,
    startup_timeout: float = 60.0,
    executable: str | None = None,
    cwd: Path = REPO_ROOT,
) -> GunicornServer:
    """Start ``gunicorn <app> -w <workers> -b 127.0.0.1:<free port>``; wait for /healthz.

    ``threads`` above 1 runs threaded workers (``--threads``) that hold half as many reads
    for an approval's decision, as ``settle.gunicorn_conf`` makes them.
    ``executable`` is another install's gunicorn (the production install's test), run
    from ``cwd``; ``env`` values of None are removed from the environment. Output
    (access errors, tracebacks) goes to ``log_path``. Raises RuntimeError, with the
    log's tail, if it is not healthy within ``startup_timeout`` seconds; a failed start
    leaves no process behind.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**child_environment(env or {}), "DATABASE_URL": database_url}
    if threads > 1:  # as settle.gunicorn_conf sets it, which this runs without
        child_env.setdefault("SETTLE_APPROVAL_WAITS", str(approval_waits(threads)))
    deadline = time.monotonic() + startup_timeout
    for _attempt in range(3):
        port = _free_port()
        gunicorn = executable or gunicorn_executable()
        command = [gunicorn, app, "-w", str(workers), "-b", f"127.0.0.1:{port}"]
        if threads > 1:
            command += ["--threads", str(threads)]
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        server = GunicornServer(process, f"http://127.0.0.1:{port}", log_path, command)
        while time.monotonic() < deadline and process.poll() is None:
            if _healthy(server.url):
                return server
            time.sleep(0.1)
        gunicorn_stop(server)
        if time.monotonic() >= deadline:
            break
        # It exited early (most likely the port was taken meanwhile): try another port.
    raise RuntimeError(f"gunicorn did not become healthy; log tail:\n{server.log_tail()}")


def gunicorn_stop(server: GunicornServer, stop_timeout: float = 20.0) -> int | None:
    """Graceful stop (SIGTERM), then SIGKILL to the whole group; reap. Returns the exit code."""
    return process_stop(server.process, stop_timeout)


@contextlib.contextmanager
def gunicorn_running(**kwargs: Any) -> Iterator[GunicornServer]:
    """``gunicorn_start(**kwargs)`` for the ``with`` block; always stopped afterwards."""
    server = gunicorn_start(**kwargs)
    try:
        yield server
    finally:
        gunicorn_stop(server)


# -- what a run against gunicorn reads from PostgreSQL ---------------------------------------


def pg_deadlocks(connection: Any) -> int:
    """Deadlocks PostgreSQL counted in ``connection``'s database (a Django connection).

    Backends report their statistics when they go idle or exit, so read this after
    :func:`pg_wait_for_other_sessions`, once the server that caused them is stopped.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def pg_wait_for_other_sessions(connection: Any, timeout: float = 15.0) -> bool:
    """Wait (bounded) until no other session uses the database; True if none is left.

    A backend leaves ``pg_stat_activity`` only after it flushed its statistics, so this
    is also the point from which :func:`pg_deadlocks` counts everything it did.
    """
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
