"""Audit exports as jobs: asked for on the page, written by a worker, handed to their owner.

The worker's part runs here in-process (``audit_export_run``, what the task calls); a
real worker on Redis writes one in tests/integration/test_fault_exports.py.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from guardian.models import UserObjectPermission

from audit.models import AuditEvent
from common.actors import Actor
from console.models import AuditExport
from console.services.audit_export import (
    TRAILER,
    audit_export_run,
    export_file_check,
    export_path,
)
from recovery.services.roles import role_grant
from tests.support.console import console_user


@pytest.fixture
def trail(stuck, other_stuck):
    stuck.unknown("pay-1")
    other_stuck.unknown("ledger-1")


@pytest.fixture(autouse=True)
def export_dir(settings: Any, tmp_path: Path) -> Path:
    settings.SETTLE_AUDIT_EXPORT_DIR = tmp_path / "exports"
    return settings.SETTLE_AUDIT_EXPORT_DIR


def _ask(client: Any, query: str = "", export_format: str = "jsonl") -> AuditExport:
    response = client.post(f"/audit/exports/?{query}", {"format": export_format})
    assert response.status_code == 302, response.content
    export = AuditExport.objects.get()
    assert response["Location"] == f"/audit/exports/{export.pk}/"
    return export


def _written(export: AuditExport) -> AuditExport:
    done = audit_export_run(export_id=str(export.pk))
    assert done is not None and done.status == "done", done and done.error
    return done


def test_an_export_is_a_job_its_page_follows_and_its_file_carries_a_trailer(
    signed_in, operator, trail, django_capture_on_commit_callbacks
):
    client = signed_in(operator)
    with django_capture_on_commit_callbacks() as published:
        export = _ask(client, "key=pay-1", "csv")
    assert len(published) == 1  # the worker's task, once the request committed
    recorded = AuditEvent.objects.filter(kind="audit_exported").get()
    assert recorded.data == {"format": "csv", "filters": {"key": "pay-1"}, "export": str(export.pk)}
    page = client.get(f"/audit/exports/{export.pk}/")
    assert page.status_code == 200 and b"data-export-status>queued" in page.content
    assert b"/download" not in page.content

    _written(export)
    page = client.get(f"/audit/exports/{export.pk}/")
    assert b"data-export-status>done" in page.content and b"/download" in page.content
    response = client.get(f"/audit/exports/{export.pk}/download")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content).decode("utf-8")
    lines, trailer = body[: body.rindex(TRAILER)], body[body.rindex(TRAILER) :]
    rows = list(csv.DictReader(io.StringIO(lines)))
    stored = AuditEvent.objects.filter(operation_key="pay-1").order_by("id")
    assert [int(row["id"]) for row in rows] == [event.pk for event in stored]
    assert trailer.startswith(f"{TRAILER} rows={len(rows)} sha256=")
    assert export_file_check(path=export_path(export)).complete


def test_a_cut_export_is_told_from_a_complete_one(signed_in, operator, trail):
    export = _written(_ask(signed_in(operator)))
    path = export_path(export)
    whole = path.read_bytes()
    check = export_file_check(path=path)
    assert check.complete and check.rows == AuditEvent.objects.filter(operation_key="pay-1").count()
    for cut in (len(whole) - 1, whole.rindex(TRAILER.encode()), whole.index(b"\n") + 1, 10):
        path.write_bytes(whole[:cut])
        assert not export_file_check(path=path).complete, cut
    # An event edited in the file: the trailer no longer vouches for it.
    first = json.loads(whole.split(b"\n", 1)[0])
    path.write_bytes(whole.replace(first["hash"].encode(), b"sha256:" + b"0" * 64, 1))
    assert not export_file_check(path=path).complete


def test_only_its_owner_may_follow_or_download_an_export(signed_in, operator, viewer, trail):
    export = _written(_ask(signed_in(operator)))
    client = signed_in(viewer)  # the same provider, not the same person
    for path in (f"/audit/exports/{export.pk}/", f"/audit/exports/{export.pk}/download"):
        assert client.get(path).status_code == 404
    assert client.get("/audit/exports/not-a-uuid/").status_code == 404


def test_a_viewer_of_one_provider_cannot_download_an_export_holding_another(
    signed_in, provider, other_provider, trail
):
    # Asked for while the user viewed both providers; one of them was withdrawn since.
    user = console_user("wanda", "viewer", provider)
    role_grant(user=user, role="viewer", provider=other_provider, actor=Actor.system("test"))
    client = signed_in(user)
    export = _written(_ask(client))
    assert export.providers == sorted([provider.name, other_provider.name])
    assert "ledger-1" in export_path(export).read_text()
    assert client.get(f"/audit/exports/{export.pk}/download").status_code == 200
    UserObjectPermission.objects.filter(user=user, object_pk=str(other_provider.pk)).delete()
    assert client.get(f"/audit/exports/{export.pk}/download").status_code in (403, 404)
    assert client.get(f"/audit/exports/{export.pk}/").status_code in (403, 404)


def test_a_supervisor_no_longer_cannot_download_the_system_chain_they_exported(
    signed_in, supervisor, provider, trail
):
    client = signed_in(supervisor)
    export = _written(_ask(client))
    assert export.system_chain and '"chain":""' in export_path(export).read_text()
    assert client.get(f"/audit/exports/{export.pk}/download").status_code == 200
    # The supervisor role withdrawn, the operator's kept: the providers are still theirs.
    UserObjectPermission.objects.filter(
        user=supervisor, permission__codename="approve_reconciliations"
    ).delete()
    assert client.get(f"/audit/exports/{export.pk}/download").status_code in (403, 404)


def test_a_bad_filter_or_format_asks_for_nothing(signed_in, operator, trail):
    client = signed_in(operator)
    assert client.post("/audit/exports/?since=yesterday", {"format": "csv"}).status_code == 400
    refused = client.post("/audit/exports/", {"format": "xlsx"})
    assert refused.status_code == 400 and refused.content.startswith(b"invalid_format")
    assert client.get("/audit/exports/").status_code == 405
    assert not AuditExport.objects.exists()
    assert not AuditEvent.objects.filter(kind="audit_exported").exists()


def test_the_streamed_export_ends_with_its_trailer_too(signed_in, operator, trail):
    response = signed_in(operator).get("/audit/export.jsonl?key=pay-1")
    body = b"".join(response.streaming_content).decode("utf-8")
    assert body.splitlines()[-1].startswith(f"{TRAILER} rows=")


def test_the_trail_page_offers_export_jobs(signed_in, operator, trail):
    html = signed_in(operator).get("/audit/?key=pay-1").content.decode()
    assert 'action="/audit/exports/?key=pay-1"' in html
    assert 'value="csv"' in html and 'value="jsonl"' in html
