"""A Celery worker started from the checkout with ``SETTLE_SQL_COUNT_DIR`` counts its SQL
in each pool process (``bench.apps``), as ``benchmark_recovery`` reads it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from settle.celery import SWEEP_TASK
from settle.celery import app as celery_app

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_each_pool_process_of_a_counting_worker_writes_its_statements(
    celery_env: dict[str, str | None], celery_procs: Any, tmp_path: Path
) -> None:
    counts = tmp_path / "sql"
    counts.mkdir()
    worker = celery_procs("worker", {**celery_env, "SETTLE_SQL_COUNT_DIR": str(counts)})
    celery_app.send_task(SWEEP_TASK, queue=celery_env["SETTLE_CELERY_QUEUE"])
    deadline = time.monotonic() + 30
    while not list(counts.glob("*.json")):
        assert time.monotonic() < deadline, "no count written within 30 s"
        time.sleep(0.1)

    (written,) = counts.glob("*.json")
    assert int(written.stem) in worker.children()  # the pool process, not the main one
    assert json.loads(written.read_text())["statements"] > 0
