"""The audit trail: the events a user may read, filtered, paged, and exported."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST, require_safe

from common.actors import Actor
from console.forms import AUDIT_KINDS, AuditFilterForm, page_queries
from console.models import AuditExport
from console.selectors.audit_trail import (
    audit_events_export_for_user,
    audit_events_for_user,
    audit_health_for_user,
)
from console.services.audit_export import (
    audit_export_for_user,
    audit_export_request,
    audit_exports_for_user,
    export_path,
    sealed_export,
)
from console.services.audit_trail import (
    ExportFormat,
    audit_alarm_resolve,
    audit_export_record,
)
from console.views.access import refusal_status_raise
from recovery.selectors.access import (
    audit_alarms_for_user,
    providers_visible_to,
    supervises_any_provider,
)
from recovery.services.errors import NotFound, RecoveryError

PAGE_SIZE = 50


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
    supervisor = supervises_any_provider(user=request.user)
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


def _filter_refused(form: AuditFilterForm) -> HttpResponse | None:
    """400 for a filter that does not parse: unlike the page, an export does not drop a
    bad filter, since it would hand out more than was asked for."""
    if not form.errors:
        return None
    problems = "; ".join(
        f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()
    )
    return HttpResponse(
        f"invalid_filter: {problems}\n", status=400, content_type="text/plain; charset=utf-8"
    )


def _export(request: HttpRequest, export_format: ExportFormat) -> HttpResponseBase:
    """Record the export, then stream it, its trailer last; a bad filter is refused.

    For a small trail: a stream longer than the server lets a response run is cut
    short, which its missing trailer then shows. A large one is an export job.
    """
    form = _form(request)
    refused = _filter_refused(form)
    if refused is not None:
        return refused
    audit_export_record(
        filters=form.query(),
        export_format=export_format,
        actor=Actor.of("user", request.user),
    )
    events = audit_events_export_for_user(user=request.user, filters=form.filters())
    lines = iter(sealed_export(events, export_format))
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


@login_required
@require_POST
def audit_export_start(request: HttpRequest) -> HttpResponseBase:
    """Ask for an export of the trail the URL filters, written by a worker: its page."""
    form = _form(request)
    refused = _filter_refused(form)
    if refused is not None:
        return refused
    try:
        export = audit_export_request(
            user=request.user,
            filters=form.filters(),
            query=form.query(),
            export_format=request.POST.get("format", ""),
        )
    except RecoveryError as error:
        return HttpResponse(
            f"{error.code}: {error.message}\n", status=400, content_type="text/plain; charset=utf-8"
        )
    return redirect("audit-export", export_id=export.pk)


def _export_for_viewer(request: HttpRequest, export_id: str) -> AuditExport:
    try:
        return audit_export_for_user(user=request.user, export_id=export_id)
    except RecoveryError as error:
        refusal_status_raise(error)
        raise Http404(error.message) from error


@login_required
@require_safe
def audit_export_page(request: HttpRequest, export_id: str) -> HttpResponse:
    """An export's progress, and its download once written; htmx polls while it runs."""
    export = _export_for_viewer(request, export_id)
    context = {
        "export": export,
        "exports": audit_exports_for_user(user=request.user),
        "working": export.status in (AuditExport.Status.QUEUED, AuditExport.Status.RUNNING),
    }
    template = "console/audit_export.html#status" if request.htmx else "console/audit_export.html"  # type: ignore[attr-defined]
    return render(request, template, context)


@login_required
@require_safe
def audit_export_download(request: HttpRequest, export_id: str) -> HttpResponseBase:
    """The written file, to its requester only, while they still view all it holds."""
    export = _export_for_viewer(request, export_id)
    path = export_path(export)
    if export.status != AuditExport.Status.DONE or not path.exists():
        raise Http404("this export is not written yet")
    content_type = "text/csv" if export.export_format == "csv" else "application/jsonl"
    name = f"settle-audit-{export.created_at:%Y%m%dT%H%M%SZ}.{export.export_format}"
    response = FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=name,
        content_type=f"{content_type}; charset=utf-8",
    )
    response["Cache-Control"] = "no-store"
    return response
