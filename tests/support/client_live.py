"""Run the client library's own tests from a venv of its own, against a live Settle.

``.ci/run`` calls it as::

    DATABASE_URL=postgres://…/settle_client CELERY_BROKER_URL=redis://…/N \\
        .venv/bin/python -m tests.support.client_live --client-venv DIR

It migrates that (fresh) database, configures a journal provider and an HTTP provider
with a callback secret, makes a host and an approver credential, starts gunicorn, a
Celery worker and beat (``tests/support``'s helpers, as the soak test does), then runs
``DIR/bin/pytest`` in ``clients/python`` with ``SETTLE_URL`` and the tokens in its
environment (see ``clients/python/tests/conftest.py``), and stops everything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import django

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO_ROOT / "clients" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--client-venv", required=True, type=Path)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settle.settings")
    django.setup()

    from django.core.management import call_command

    from approvals.services.approvers import approver_create
    from harness.celery_procs import beat_start, worker_start
    from harness.gunicorn import gunicorn_start, gunicorn_stop
    from recovery.services.credentials import host_create
    from recovery.services.providers import provider_configure

    call_command("migrate", verbosity=0)
    with tempfile.TemporaryDirectory(prefix="settle-client-live-") as scratch:
        directory = Path(scratch)
        journal = directory / "journal.jsonl"
        journal.touch()
        provider_configure(name="client-orders", adapter="journal", path=str(journal))
        provider_configure(
            name="client-hooks",
            adapter="http",
            url="http://127.0.0.1:9",
            secret="client-hook-secret",
        )
        call_command("policy", "apply", str(CLIENT_DIR / "tests" / "policy.toml"), "--yes")
        _, host_token = host_create(name=f"client-ci-{os.getpid()}")
        _, approver_token = approver_create(name=f"client-ci-{os.getpid()}", all_providers=True)
        env = {"SETTLE_AUDIT_CHECKPOINT_FILE": str(directory / "checkpoints.jsonl")}
        worker = worker_start(log_path=directory / "worker.log", env=env, concurrency=2)
        beat = beat_start(directory=directory, env=env)
        server = gunicorn_start(
            database_url=os.environ["DATABASE_URL"],
            log_path=directory / "gunicorn.log",
            workers=2,
            env=env,
        )
        try:
            client_env = {
                **os.environ,
                "SETTLE_URL": server.url,
                "SETTLE_HOST_TOKEN": host_token,
                "SETTLE_APPROVER_TOKEN": approver_token,
                "SETTLE_PROVIDER": "client-orders",
                "SETTLE_CALLBACK_PROVIDER": "client-hooks",
                "SETTLE_CALLBACK_SECRET": "client-hook-secret",
            }
            # Nothing of the checkout on the path: the installed package alone is tested.
            client_env.pop("PYTHONPATH", None)
            venv = args.client_venv.resolve()
            status = subprocess.call(
                [str(venv / "bin" / "pytest"), "-p", "no:cacheprovider", *args.pytest_args],
                cwd=CLIENT_DIR,
                env=client_env,
            )
            if status:
                print(server.log_tail(), file=sys.stderr)
            return status
        finally:
            gunicorn_stop(server)
            beat.stop()
            worker.stop()


if __name__ == "__main__":
    sys.exit(main())
