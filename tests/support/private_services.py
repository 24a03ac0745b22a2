"""A PostgreSQL cluster and a Redis of a test's own, that the test may stop, restart or hang.

The fault tests break their database and their broker on purpose; other tests (and
other runs on the machine) use the shared services, which must never be touched. So
each such test starts its own: a PostgreSQL 15 cluster (``initdb`` under a temporary
directory, run as the ``postgres`` OS user when the test runs as root, trust
authentication, TCP on a free loopback port) and a ``redis-server`` on another free
port, both removed at the end whatever happened::

    def test_x(private_postgres: PrivatePostgres, private_redis: PrivateRedis) -> None:
        url = private_postgres.url("settle")    # created empty; migrate it
        private_postgres.restart()
        private_redis.stop(); private_redis.start()
        with private_redis.hung(seconds=5): ...  # DEBUG SLEEP: it answers nothing meanwhile

Neither needs the network nor the shared services: loopback is enough, so the tests run
on a fresh machine too where the binaries are installed. Without them the fixtures skip,
except under ``SETTLE_REQUIRE_POSTGRES`` (CI), where they fail. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.celery_procs import Proc, redis_start
from harness.providers import _free_port


def _pg_bin() -> Path:
    """``SETTLE_TEST_PG_BIN``, else PostgreSQL 15's binaries, else the newest installed."""
    given = os.environ.get("SETTLE_TEST_PG_BIN")
    if given:
        return Path(given)
    wanted = Path("/usr/lib/postgresql/15/bin")
    if wanted.exists():
        return wanted
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    return installed[-1].parent if installed else wanted


PG_BIN = _pg_bin()
STRICT = bool(os.environ.get("SETTLE_REQUIRE_POSTGRES"))


def _unavailable(reason: str) -> None:
    """Skip on a machine without the tool; fail in CI, where every test must run."""
    if STRICT:
        pytest.fail(f"{reason} (SETTLE_REQUIRE_POSTGRES is set: install it)")
    pytest.skip(reason)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- PostgreSQL -------------------------------------------------------------------------


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster in ``directory`` on ``port``, owned by ``os_user``."""

    directory: Path
    port: int
    os_user: str | None  # None: this process's own user
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.directory / "postgres.log"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", self.os_user, "--"] if self.os_user else []
        return subprocess.run(
            [*prefix, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
        )

    def _pg_ctl(self, *args: str, timeout: float = 60.0) -> None:
        result = self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(
                f"pg_ctl {' '.join(args)} failed: {result.stdout}{result.stderr}\n{self.log_tail()}"
            )

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text("utf-8", "replace")[-size:]
        return ""

    def init(self) -> None:
        result = self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stdout}{result.stderr}")
        # A throwaway cluster: no durability to pay for, sockets under its own directory.
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.directory}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 60\nshared_buffers = 32MB\n"
            )

    def start(self, timeout: float = 60.0) -> None:
        self._pg_ctl("-l", str(self.log_path), "-w", "-t", str(int(timeout)), "start")

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """``pg_ctl stop -m fast`` (every session cut, as a restart does) or ``immediate``."""
        self._pg_ctl("-w", "-t", str(int(timeout)), "-m", mode, "stop", timeout=timeout + 10)

    def restart(self, timeout: float = 60.0) -> None:
        """Every connection is cut, the server is back (as ``pg_ctlcluster … restart``)."""
        self._pg_ctl(
            "-l", str(self.log_path), "-w", "-t", str(int(timeout)), "-m", "fast", "restart"
        )

    @property
    def running(self) -> bool:
        return _port_open(self.port)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with psql as the superuser; its output (unaligned, tuples only)."""
        result = subprocess.run(
            [str(PG_BIN / "psql"), "-X", "-At", "-v", "ON_ERROR_STOP=1", self.url(database)],
            input=sql,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr}")
        return result.stdout

    def createdb(self, name: str) -> str:
        """An empty database ``name``; its URL."""
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        """Stopped (immediately: nothing to keep) and its directory removed."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop(mode="immediate", timeout=30)
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():  # pg_ctl could not stop it: kill the postmaster itself
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.directory, ignore_errors=True)


def postgres_start() -> PrivatePostgres:
    """A new cluster, started; skips (fails under CI's strict run) without PostgreSQL 15."""
    if not (PG_BIN / "initdb").exists():
        _unavailable(f"PostgreSQL's server binaries are not in {PG_BIN}")
    os_user: str | None = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        if shutil.which("runuser") is None:
            _unavailable("running as root without runuser: cannot initdb as postgres")
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no postgres OS user for initdb")
        os_user = "postgres"
    # Not under pytest's tmp_path: the postgres user must reach it.
    directory = Path(tempfile.mkdtemp(prefix="settle-private-pg-"))
    if os_user is not None:
        os.chown(directory, owner.pw_uid, owner.pw_gid)
    cluster = PrivatePostgres(directory=directory, port=_free_port(), os_user=os_user)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


@contextlib.contextmanager
def postgres_running() -> Iterator[PrivatePostgres]:
    cluster = postgres_start()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test's own (see the module's docstring)."""
    with postgres_running() as cluster:
        yield cluster


# -- Redis ------------------------------------------------------------------------------


@dataclass
class PrivateRedis:
    """A ``redis-server`` on ``port`` that the test may stop, start again or hang."""

    directory: Path
    port: int
    proc: Proc | None = None
    starts: int = 0
    _sleepers: list[threading.Thread] = field(default_factory=list)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        """Start it (again) on the same port, empty (no persistence)."""
        if self.proc is not None and self.proc.process.poll() is None:
            return
        executable = shutil.which("redis-server")
        if executable is None:
            _unavailable("redis-server is not installed")
        self.starts += 1
        run = self.directory / f"run{self.starts}"  # a log of its own: "Ready" is this run's
        run.mkdir()
        deadline = time.monotonic() + 20
        while True:  # the old process's port may linger for a moment
            try:
                self.proc, _ = redis_start(
                    run, port=self.port, extra=("--enable-debug-command", "yes")
                )
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        """Gone: every connection refused until :meth:`start`."""
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def hang(self, seconds: float) -> threading.Thread:
        """``DEBUG SLEEP seconds`` from a thread: Redis accepts and answers nothing meanwhile."""
        import redis

        def sleep() -> None:
            client = redis.Redis.from_url(self.url(), socket_timeout=seconds + 30)
            with contextlib.suppress(redis.RedisError):
                client.execute_command("DEBUG", "SLEEP", seconds)
            client.close()

        thread = threading.Thread(target=sleep, name=f"redis-debug-sleep-{self.port}", daemon=True)
        thread.start()
        self._sleepers.append(thread)
        time.sleep(0.2)  # the command is in before the caller goes on
        return thread

    @contextlib.contextmanager
    def hung(self, seconds: float) -> Iterator[None]:
        """Hung for the block (at most ``seconds``); the block waits for it to answer again."""
        thread = self.hang(seconds)
        yield
        thread.join(timeout=seconds + 30)

    def destroy(self) -> None:
        if self.proc is not None and self.proc.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.proc.pid, signal.SIGCONT)
        self.stop()
        for thread in self._sleepers:
            thread.join(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


def redis_private_start() -> PrivateRedis:
    """A new ``redis-server`` with ``DEBUG`` enabled, started; skips without the binary."""
    if shutil.which("redis-server") is None:
        _unavailable("redis-server is not installed")
    directory = Path(tempfile.mkdtemp(prefix="settle-private-redis-"))
    server = PrivateRedis(directory=directory, port=_free_port())
    try:
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server


@contextlib.contextmanager
def redis_private_running() -> Iterator[PrivateRedis]:
    server = redis_private_start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A Redis of this test's own (see the module's docstring)."""
    with redis_private_running() as server:
        yield server
