"""Audit exports as jobs: asked for in a request, written to a file by a worker, handed out.

An export of a large trail takes longer than gunicorn lets a response run; streamed, it
was cut off after its 200 and looked complete. Here the request only records the export
(``audit_exported``, on the system chain) and queues it; a worker writes the file under
``SETTLE_AUDIT_EXPORT_DIR`` and renames it into place when the trailer is written. The
trailer (the last line) gives the rows written and the SHA-256 of every byte before it,
so a file cut anywhere, by anyone, fails ``export_file_check``.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.hashing import event_export
from audit.kinds import AuditKind
from audit.models import AuditEvent
from common.actors import Actor
from common.canonical import canonical_dumps
from common.errors import ErrorCode
from console.models import AuditExport
from console.selectors.audit_trail import AuditFilters, audit_events_export_for_user
from recovery.selectors.access import providers_visible_to, supervises_any_provider
from recovery.services.errors import Forbidden, Invalid, NotFound

logger = logging.getLogger("settle.audit")

EXPORT_FORMATS = ("csv", "jsonl")
EXPORT_COLUMNS = ("id", "at", "chain", "seq", "kind", "actor", "data", "prev_hash", "hash")
# Every export's last line starts so: "<marker> rows=<n> sha256=<hex>" (in CSV, one
# field; in JSON Lines, the one line that is not an event).
TRAILER = "#settle-audit-export complete"
# How often a running export writes its progress (rows) for the console to show.
PROGRESS_EVERY = 5000


class _Echo:
    """A file that hands back what is written to it: ``csv.writer`` into a stream."""

    def write(self, value: str) -> str:
        return value


def export_lines(events: Iterable[AuditEvent], export_format: str) -> Iterator[str]:
    """The export's lines, one per event (CSV: after its header), without the trailer."""
    if export_format == "csv":
        writer = csv.writer(_Echo())
        yield writer.writerow(EXPORT_COLUMNS)
        for event in events:
            record = event_export(event)
            record["data"] = canonical_dumps(record["data"]).decode("utf-8")
            yield writer.writerow([record[column] for column in EXPORT_COLUMNS])
    else:
        for event in events:
            yield canonical_dumps(event_export(event)).decode("utf-8") + "\n"


class Sealed:
    """Lines, counted and hashed as they pass, then the trailer that vouches for them."""

    def __init__(self, lines: Iterable[str], *, header: bool) -> None:
        self._lines = lines
        self._header = header
        self.rows = 0
        self.digest = hashlib.sha256()

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self._lines):
            self.digest.update(line.encode("utf-8"))
            if number or not self._header:
                self.rows += 1
            yield line
        yield self.trailer()

    def trailer(self) -> str:
        return f"{TRAILER} rows={self.rows} sha256={self.digest.hexdigest()}\n"


def sealed_export(events: Iterable[AuditEvent], export_format: str) -> Sealed:
    return Sealed(export_lines(events, export_format), header=export_format == "csv")


@dataclass(frozen=True)
class ExportCheck:
    complete: bool
    rows: int | None  # as the trailer gives them
    problem: str  # why it is not complete; empty when it is


def export_file_check(*, path: Path) -> ExportCheck:
    """Whether the export at ``path`` is whole: its last line a trailer whose hash is that
    of every byte before it. Reads the file once, in blocks."""
    digest = hashlib.sha256()
    last = b""
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            data = last + block
            cut = data.rfind(b"\n", 0, len(data) - 1) + 1  # keep the last line back
            digest.update(data[:cut])
            last = data[cut:]
    text = last.decode("utf-8", errors="replace")
    if not text.startswith(TRAILER) or not text.endswith("\n"):
        return ExportCheck(False, None, "no trailer: the export was cut short")
    fields = dict(part.partition("=")[::2] for part in text[len(TRAILER) :].split())
    if fields.get("sha256") != digest.hexdigest():
        return ExportCheck(False, None, "the trailer's sha256 does not match the lines before it")
    return ExportCheck(True, int(fields.get("rows", "0")), "")


def _filters_stored(filters: AuditFilters) -> dict[str, Any]:
    return {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in asdict(filters).items()
        if value
    }


def _filters_read(stored: dict[str, Any]) -> AuditFilters:
    values = dict(stored)
    for name in ("since", "until"):
        if values.get(name):
            values[name] = datetime.fromisoformat(values[name])
    return AuditFilters(**values)


def audit_export_request(
    *, user: Any, filters: AuditFilters, query: dict[str, str], export_format: str
) -> AuditExport:
    """Record that ``user`` exported the trail narrowed by ``filters`` and queue the export.

    The record and the job commit together; the job is published after the commit.
    """
    if export_format not in EXPORT_FORMATS:
        raise Invalid(ErrorCode.INVALID_FORMAT, f"an export is one of {', '.join(EXPORT_FORMATS)}")
    providers = sorted(providers_visible_to(user=user).values_list("name", flat=True))
    with audit_transaction():
        export = AuditExport.objects.create(
            id=uuid.uuid4(),
            requested_by=user,
            export_format=export_format,
            filters=_filters_stored(filters),
            providers=providers,
            system_chain=supervises_any_provider(user=user),
        )
        audit_append(
            kind=AuditKind.AUDIT_EXPORTED,
            actor=Actor.of("user", user),
            data={"format": export_format, "filters": query, "export": str(export.pk)},
        )
    # By name, as bulk work publishes: the task module imports this one.
    transaction.on_commit(
        lambda: current_app.send_task("console.tasks.audit_export", args=[str(export.pk)])
    )
    return export


def export_path(export: AuditExport) -> Path:
    return Path(settings.SETTLE_AUDIT_EXPORT_DIR) / f"{export.pk}.{export.export_format}"


def audit_export_run(*, export_id: str) -> AuditExport | None:
    """Write the export's file (its owner's view of the trail), then mark it done.

    Safe to run twice: a finished export is left as it is; one found running (its worker
    died) is written again from the start, into a file of its own until renamed.
    """
    export = AuditExport.objects.filter(pk=export_id).first()
    if export is None or export.status in (AuditExport.Status.DONE, AuditExport.Status.FAILED):
        return export
    AuditExport.objects.filter(pk=export.pk).update(status=AuditExport.Status.RUNNING, rows=0)
    final = export_path(export)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}.{os.getpid()}.part")
    try:
        user = get_user_model().objects.get(pk=export.requested_by_id)
        events = audit_events_export_for_user(user=user, filters=_filters_read(export.filters))
        sealed = sealed_export(events, export.export_format)
        with partial.open("w", encoding="utf-8", newline="") as handle:
            for line in sealed:
                handle.write(line)
                if sealed.rows and sealed.rows % PROGRESS_EVERY == 0:
                    AuditExport.objects.filter(pk=export.pk).update(rows=sealed.rows)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, final)
    except Exception as error:
        partial.unlink(missing_ok=True)
        AuditExport.objects.filter(pk=export.pk).update(
            status=AuditExport.Status.FAILED, error=str(error)[:2000], finished_at=timezone.now()
        )
        logger.exception("audit export %s failed", export.pk)
        raise
    AuditExport.objects.filter(pk=export.pk).update(
        status=AuditExport.Status.DONE,
        rows=sealed.rows,
        sha256=sealed.digest.hexdigest(),
        finished_at=timezone.now(),
    )
    export.refresh_from_db()
    return export


def audit_export_for_user(*, user: Any, export_id: Any) -> AuditExport:
    """The export ``user`` asked for, if they may still read all it holds.

    Only its requester, and only while they still view every provider they viewed
    when they asked, and still supervise if they did: an export may hold any of those
    providers' events, and the system chain.
    """
    try:
        ident = uuid.UUID(str(export_id))
    except ValueError:
        raise NotFound(ErrorCode.UNKNOWN_EXPORT, "no such export") from None
    export = AuditExport.objects.filter(pk=ident, requested_by=user).first()
    if export is None:
        raise NotFound(ErrorCode.UNKNOWN_EXPORT, "no such export")
    visible = set(providers_visible_to(user=user).values_list("name", flat=True))
    if not set(export.providers) <= visible:
        raise Forbidden("this export holds events of providers you no longer view")
    if export.system_chain and not supervises_any_provider(user=user):
        raise Forbidden("this export holds the system chain, which you no longer supervise")
    return export


def audit_exports_for_user(*, user: Any, limit: int = 10) -> list[AuditExport]:
    return list(AuditExport.objects.filter(requested_by=user)[:limit])
