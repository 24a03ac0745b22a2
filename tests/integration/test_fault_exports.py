"""An audit export longer than a response may run is a job: a real worker writes the file.

Streamed, a large export was cut off by gunicorn's timeout after its 200 and looked
complete. Here ``celery -A settle worker`` (on Redis, the test database) writes a few
thousand events to a file whose trailer vouches for every byte; the file is checked
the way its reader would check it, and the same file cut short is told apart.
"""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from audit.hashing import exported_event_hash
from audit.models import AuditEvent
from bench import seed
from console.models import AuditExport
from console.services.audit_export import TRAILER, export_file_check, export_path

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_a_worker_writes_a_large_export_whole_and_a_cut_copy_is_told_apart(
    celery_env: Any, celery_procs: Any, celery_queue: str, settings: Any, tmp_path: Path
) -> None:
    exports = tmp_path / "exports"
    settings.CELERY_TASK_DEFAULT_QUEUE = celery_queue
    settings.SETTLE_AUDIT_EXPORT_DIR = exports
    seed.seed_operations(1500)  # about 3,300 events on valid chains
    admin = get_user_model().objects.create_superuser("root", "", "unused-pw-0123")
    celery_procs("worker", {**celery_env, "SETTLE_AUDIT_EXPORT_DIR": str(exports)})
    client = Client()
    client.force_login(admin)

    began = time.monotonic()
    response = client.post("/audit/exports/", {"format": "csv"})
    assert response.status_code == 302
    assert time.monotonic() - began < 2  # the request only asks
    export = AuditExport.objects.get()
    deadline = time.monotonic() + 60
    while export.status not in ("done", "failed"):
        assert time.monotonic() < deadline, f"not written within 60 s: {export.status}"
        time.sleep(0.2)
        export.refresh_from_db()
    assert export.status == "done", export.error
    assert b"data-export-status>done" in client.get(f"/audit/exports/{export.pk}/").content

    download = client.get(f"/audit/exports/{export.pk}/download")
    body = b"".join(download.streaming_content)
    path = export_path(export)
    assert body == path.read_bytes()
    check = export_file_check(path=path)
    assert check.complete, check.problem
    text = body.decode("utf-8")
    rows = list(csv.DictReader(io.StringIO(text[: text.rindex(TRAILER)])))
    # Every event as it stood when the export was asked for (its own record included).
    assert check.rows == len(rows) == AuditEvent.objects.count() > 3000
    assert [int(row["id"]) for row in rows] == sorted(int(row["id"]) for row in rows)
    assert all(exported_event_hash(row) == row["hash"] for row in rows)

    cut = tmp_path / "cut.csv"
    cut.write_bytes(body[: len(body) // 2])  # what a timeout after the 200 leaves
    assert not export_file_check(path=cut).complete
    cut.write_bytes(body[: body.rindex(TRAILER.encode())])  # every event, no trailer
    assert not export_file_check(path=cut).complete
