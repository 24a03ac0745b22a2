"""``manage.py demo``: seeded by real killed workers, and stopped cleanly by Ctrl-C.

The demo runs as a subprocess on the embedded default, as a newcomer runs it: its own
SQLite database and filesystem broker under a temporary ``SETTLE_VAR_DIR``, whatever
database and broker the suite itself uses. Its replacement workers' resumes only queue
lookups; the demo's own Celery worker runs them while it seeds, even with ``--no-serve``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.providers import _free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(REPO_ROOT / "manage.py")]

pytestmark = pytest.mark.processes

# What the console shows, read through the console's own selectors as the supervisor.
CONSOLE_VIEW = """
import json
from django.contrib.auth import get_user_model
from recovery.models import Operation
from recovery.selectors.queue import QueueFilters
from recovery.selectors.queue import operations_queue_counts_for_user as counts
from recovery.selectors.queue import operations_queue_for_user as queue
user = get_user_model().objects.get(username="supervisor")
page = queue(user=user, filters=QueueFilters(), after=None, limit=500)
print(json.dumps({
    "states": dict(Operation.objects.values_list("key", "state")),
    "recovered": sorted(Operation.objects.filter(recovered=True).values_list("key", flat=True)),
    "queue": sorted(row.key for row in page.rows),
    "counts": counts(user=user),
    "verdicts": {row.key: row.latest_verdict for row in page.rows},
}))
"""


def demo_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """The suite's environment without its database and broker: the embedded default."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.pop("SETTLE_REQUIRE_POSTGRES", None)
    return {**env, "SETTLE_VAR_DIR": str(var_dir), **extra}


def seed(var_dir: Path) -> str:
    done = subprocess.run(
        [*MANAGE, "demo", "--no-serve"],
        cwd=REPO_ROOT,
        env=demo_env(var_dir),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def console_view(var_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [*MANAGE, "shell", "-c", CONSOLE_VIEW],
        cwd=REPO_ROOT,
        env=demo_env(var_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    view: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return view


def test_demo_seeds_every_state_the_console_shows_and_a_second_run_adds_a_batch(
    tmp_path: Path,
) -> None:
    output = seed(tmp_path)

    # The Celery worker it started for the seeding is stopped, with its pool.
    assert _processes_gone(str(tmp_path))
    assert "DEMO PASSWORDS" in output
    for login in ("viewer      demo-viewer", "operator    demo-operator", "supervisor  demo-sup"):
        assert login in output
    assert "6 killed with SIGKILL" in output
    view = console_view(tmp_path)
    states = view["states"]
    assert states == {
        "demo-b1-order-paid": "released",
        "demo-b1-ledger-posted": "released",
        "demo-b1-order-died-after-commit": "released",  # recovered from the evidence
        "demo-b1-order-died-before-commit": "unknown",  # lease lost, nothing at the provider
        "demo-b1-order-other-params": "reconcile",
        "demo-b1-ledger-corrupt-line": "reconcile",
        "demo-b1-order-provider-down": "failed",
        "demo-b1-ledger-awaiting-approval": "awaiting_approval",
        "demo-b1-ledger-died-after-commit": "dispatched",  # left for the sweeper
        "demo-b1-payment-provider-down": "unknown",  # the provider did not answer
    }
    assert view["queue"] == [
        "demo-b1-ledger-corrupt-line",
        "demo-b1-order-died-before-commit",
        "demo-b1-order-other-params",
        "demo-b1-payment-provider-down",
    ]
    assert view["verdicts"] == {
        "demo-b1-ledger-corrupt-line": "corrupt",
        "demo-b1-order-died-before-commit": "absent",
        "demo-b1-order-other-params": "mismatch",
        "demo-b1-payment-provider-down": "unavailable",
    }
    # Released by the lookup its replacement worker's resume queued, from the evidence.
    assert view["recovered"] == ["demo-b1-order-died-after-commit"]
    # The four killed workers' receipts are still running: stranded.
    assert view["counts"] == {"unknown": 2, "reconcile": 2, "stranded": 4}

    again = seed(tmp_path)

    assert "Seeding batch 2" in again
    states = console_view(tmp_path)["states"]
    assert len(states) == 20
    assert {k: v for k, v in states.items() if k.startswith("demo-b1-")} == view["states"]
    assert sorted(v for k, v in states.items() if k.startswith("demo-b2-")) == sorted(
        view["states"].values()
    )


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment names ``marker`` (our var dir): the demo's own."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
            if marker.encode() in environ and "\nState:\tZ" not in status:
                found.append(int(entry.name))
    return found


def _processes_gone(marker: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _processes_with(marker) == []


def test_ctrl_c_stops_the_web_server_the_workers_and_beat_with_nothing_left_behind(
    tmp_path: Path,
) -> None:
    port = _free_port()
    log = tmp_path / "demo.out"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [*MANAGE, "demo"],
            cwd=REPO_ROOT,
            env=demo_env(tmp_path, PORT=str(port)),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while "Press Ctrl-C" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.2)
        output = log.read_text()
        assert f"Settle is running at http://127.0.0.1:{port}/" in output, output
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
        children = _processes_with(str(tmp_path))
        # gunicorn (master and workers), the Celery worker (and its pool), the webhook
        # worker (and its pool), beat.
        assert len([pid for pid in children if pid != demo.pid]) >= 7, children
        # The webhook worker consumes the webhook queue alone.
        [webhooks] = re.findall(r"webhooks (\d+)", output)
        argv = Path(f"/proc/{webhooks}/cmdline").read_text().split("\0")
        assert argv[argv.index("-Q") + 1].endswith("-webhooks"), argv

        demo.send_signal(signal.SIGINT)

        assert demo.wait(timeout=60) == 0, log.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=10)
    assert "stopped." in log.read_text()
    assert _processes_gone(str(tmp_path)), _processes_with(str(tmp_path))


@pytest.mark.django_db
def test_a_run_stopped_after_its_credentials_does_not_stop_the_next_run():
    """Interrupted between its credentials and its first operation, a batch leaves a host
    named for it; the next run takes the next number instead of failing on that name."""
    from console.management.commands.demo import Command
    from recovery.services.credentials import host_create

    host_create(name="demo-fleet-b1")
    assert Command()._next_batch() == 2
