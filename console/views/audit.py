"""The audit trail: the events a user may read, filtered, paged, and exported."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST, require_safe

from approvals.actors import Actor
from console.forms import AUDIT_KINDS, AuditFilterForm, page_queries
from console.views.access import refusal_status_raise
from recovery.audit import event_export
from recovery.canonical import canonical_dumps
from recovery.models import AuditEvent
from recovery.selectors import (
    audit_alarms_for_user,
    audit_events_export_for_user,
    audit_events_for_user,
    audit_health_for_user,
    audit_supervisor,
    providers_visible_to,
)
from recovery.services.audit_trail import (
    ExportFormat,
    audit_alarm_resolve,
    audit_export_record,
)
from recovery.services.errors import NotFound, RecoveryError

PAGE_SIZE = 50
EXPORT_COLUMNS = ("id", "at", "chain", "seq", "kind", "actor", "data", "prev_hash", "hash")


def _form(request: HttpRequest) -> AuditFilterForm:
    providers = list(providers_visible_to(user=request.user).values_list("name", flat=True))
    form = AuditFilterForm(request.GET, providers=sorted(providers))
    form.is_valid()  # an invalid filter is dropped and shown; the rest still apply
    return form


@login_required
@require_safe
def audit_trail(request: HttpRequest) -> HttpResponse:
    """The trail, filtered by the URL; htmx swaps only the results."""
    form = _form(request)
    page = audit_events_for_user(
        user=request.user,
        filters=form.filters(),
        after=getattr(form, "cleaned_data", {}).get("after"),
        limit=PAGE_SIZE,
    )
    cursor = str(page.next_after) if page.next_after is not None else None
    queries = page_queries(request.GET, cursor)
    supervisor = audit_supervisor(user=request.user)
    context = {
        "alarms": (
            list(audit_alarms_for_user(user=request.user).filter(resolved_at__isnull=True))
            if supervisor and not request.htmx  # type: ignore[attr-defined]
            else []
        ),
        "form": form,
        "page": page,
        "kinds": AUDIT_KINDS,
        "health": audit_health_for_user(user=request.user),
        "supervisor": supervisor,
        **queries,
        "export_query": queries["unpaged_query"],
    }
    template = "console/audit.html#results" if request.htmx else "console/audit.html"  # type: ignore[attr-defined]
    return render(request, template, context)


class _Echo:
    """A file that hands back what is written to it: ``csv.writer`` into a stream."""

    def write(self, value: str) -> str:
        return value


def _csv_lines(events: Iterable[AuditEvent]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(EXPORT_COLUMNS)
    for event in events:
        record = event_export(event)
        record["data"] = canonical_dumps(record["data"]).decode("utf-8")
        yield writer.writerow([record[column] for column in EXPORT_COLUMNS])


def _jsonl_lines(events: Iterable[AuditEvent]) -> Iterator[str]:
    for event in events:
        yield canonical_dumps(event_export(event)).decode("utf-8") + "\n"


def _export(request: HttpRequest, export_format: ExportFormat) -> HttpResponseBase:
    """Record the export, then stream it; a filter that does not parse is refused.

    Unlike the page, an export does not drop a bad filter: it would hand out more than
    was asked for.
    """
    form = _form(request)
    if form.errors:
        problems = "; ".join(
            f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()
        )
        return HttpResponse(
            f"invalid_filter: {problems}\n", status=400, content_type="text/plain; charset=utf-8"
        )
    audit_export_record(
        filters=form.query(),
        export_format=export_format,
        actor=Actor.of("user", request.user),
    )
    events = audit_events_export_for_user(user=request.user, filters=form.filters())
    lines = _csv_lines(events) if export_format == "csv" else _jsonl_lines(events)
    content_type = "text/csv" if export_format == "csv" else "application/jsonl"
    response = StreamingHttpResponse(lines, content_type=f"{content_type}; charset=utf-8")
    name = f"settle-audit-{timezone.now():%Y%m%dT%H%M%SZ}.{export_format}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_GET
def audit_export_csv(request: HttpRequest) -> HttpResponseBase:
    return _export(request, "csv")


@login_required
@require_GET
def audit_export_jsonl(request: HttpRequest) -> HttpResponseBase:
    return _export(request, "jsonl")


@login_required
@require_POST
def audit_alarm_resolve_view(request: HttpRequest, alarm_id: int) -> HttpResponse:
    """A supervisor says what was done about an alarm; it leaves the banner, on the record."""
    try:
        audit_alarm_resolve(
            actor=Actor.of("user", request.user),
            alarm_id=alarm_id,
            resolution=request.POST.get("resolution", ""),
        )
    except NotFound as error:
        raise Http404(error.message) from error
    except RecoveryError as error:
        refusal_status_raise(error)  # not a supervisor: 403
        messages.error(request, f"Not resolved: {error.message}.")
    else:
        messages.success(request, f"Alarm {alarm_id} resolved.")
    return redirect(reverse("audit") + "#alarms")
