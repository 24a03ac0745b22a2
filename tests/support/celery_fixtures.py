"""Fixtures for tests that run real Celery processes (a pytest plugin of the suite).

Each test gets a queue of its own on the broker the environment names (CI: Redis), its
processes use the test database, and everything is stopped and cleaned up at the end.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.db import connection

from harness.celery_procs import (
    REPO_ROOT,
    Proc,
    beat_start,
    queue_name,
    webhook_queue,
    worker_start,
)
from harness.gunicorn import database_url

BROKER = os.environ.get("CELERY_BROKER_URL", "")


def queue_delete(name: str) -> None:
    """Delete a test's queue from the broker (Redis), with whatever messages it holds."""
    if BROKER.startswith("redis://"):
        client = redis.Redis.from_url(BROKER)
        client.delete(name, f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
        client.close()


@pytest.fixture
def celery_queue() -> Iterator[str]:
    """A queue of this test's own; it and its webhook queue are deleted afterwards."""
    name = queue_name()
    yield name
    queue_delete(name)
    queue_delete(f"{name}-webhooks")


def test_database_url() -> str:
    """The test database, for processes of their own (SQLite: the test run's file)."""
    if connection.vendor == "postgresql":
        return database_url(connection.settings_dict)
    return f"sqlite:///{connection.settings_dict['NAME']}"


test_database_url.__test__ = False  # type: ignore[attr-defined]  # not a test


@pytest.fixture
def celery_env(celery_queue: str, tmp_path: Path) -> dict[str, str | None]:
    """What a Celery process of this test needs: this test's database, broker and queue."""
    if not BROKER.startswith("redis://"):
        pytest.skip("CELERY_BROKER_URL must name a Redis database (CI: redis://…/0)")
    return {
        "DATABASE_URL": test_database_url(),
        "CELERY_BROKER_URL": BROKER,
        "SETTLE_CELERY_QUEUE": celery_queue,
        "SETTLE_WEBHOOK_QUEUE": f"{celery_queue}-webhooks",
        "SETTLE_SWEEP_SECONDS": "1",
        "SETTLE_AUDIT_CHECKPOINT_FILE": str(tmp_path / "worker-checkpoints.jsonl"),
    }


@pytest.fixture
def celery_procs(tmp_path: Path) -> Iterator[object]:
    """Start workers and beat with ``start(kind, env)``; all are stopped at the end.

    ``kind``: ``worker`` (the default queue: sweep, lookups, beat's tasks), ``webhooks``
    (a worker of the webhook queue, ``-Q``, as production runs one) or ``beat``.
    ``start(kind, env, celery=…, cwd=…)`` runs another install's ``celery`` from ``cwd``.
    """
    started: list[Proc] = []
    count = Counter[str]()

    def start(
        kind: str,
        env: dict[str, str | None],
        *,
        celery: str | None = None,
        cwd: Path = REPO_ROOT,
    ) -> Proc:
        count[kind] += 1
        if kind == "beat":
            directory = tmp_path / f"beat{count[kind]}"
            directory.mkdir()
            proc = beat_start(directory=directory, env=env, celery=celery, cwd=cwd)
        else:
            name = f"{kind}{count[kind]}"
            queues = webhook_queue(env) if kind == "webhooks" else None
            proc = worker_start(
                log_path=tmp_path / f"{name}.log",
                env=env,
                name=name,
                celery=celery,
                cwd=cwd,
                queues=queues,
            )
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
