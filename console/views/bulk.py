"""Bulk work from the queue: preview a selection, submit it as a batch, follow its report.

A selection is either picked by hand (the queue's checkboxes, ``<id>.<version>``) or
"all that match this filter" (the queue's own filter, in the URL). The preview only
counts; submitting freezes the list (``bulk.services``) and Celery does the
items; the batch's page follows them (htmx polling) and ends with a report, also as CSV.
"""

from __future__ import annotations

import csv
import uuid
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from bulk.models import BulkBatch, BulkItem
from bulk.running import bulk_counts
from bulk.selectors import (
    bulk_batch_for_user,
    bulk_batches_for_user,
    bulk_items_for_user,
    operations_matching_count_for_user,
    operations_matching_for_user,
)
from bulk.services import (
    Pick,
    bulk_actions_permitted,
    bulk_approvable,
    bulk_decide,
    bulk_items_digest,
    bulk_passkey_required,
    bulk_statement,
    bulk_submit,
)
from common.actors import Actor
from common.errors import ErrorCode, SettleError
from console.forms import (
    BulkSubmitForm,
    DecisionForm,
    QueueFilterForm,
    moment_encode,
    picks_parse,
)
from console.views.access import refusal_status_raise
from console.views.signing import json_refusal, signed_record, signing_begin
from identity.selectors import passkey_held
from recovery.selectors.access import providers_visible_to
from recovery.services.errors import RecoveryError

FILTER_NAMES = ("state", "provider", "verdict", "reason", "age", "q")
# What each action does to each item, for the preview.
ACTIONS: list[tuple[str, str, str]] = [
    ("lookup", "Look up now", "queues a lookup of each operation's evidence"),
    (
        "confirm",
        "Confirm",
        "releases each operation whose latest evidence is a match; the others are refused",
    ),
    (
        "void",
        "Propose void",
        "one proposal for the whole set; nothing is voided until a second person approves it",
    ),
]
REPORT_SHOWN = 500


def _actor(request: HttpRequest) -> Actor:
    return Actor.of("user", request.user)


def _filter_form(request: HttpRequest, query: QueryDict) -> QueueFilterForm:
    providers = sorted(providers_visible_to(user=request.user).values_list("name", flat=True))
    form = QueueFilterForm(query, providers=providers)
    form.is_valid()
    return form


def _filter_query(form: QueueFilterForm) -> dict[str, str]:
    data = getattr(form, "cleaned_data", {})
    return {name: str(data[name]).strip() for name in FILTER_NAMES if data.get(name)}


def _selection(request: HttpRequest, query: QueryDict) -> dict[str, Any]:
    """What ``query`` selects: picked by hand (``op``) or all that match its filter.

    ``error`` says what is wrong with it, if anything; counting is all that is done.
    """
    picked = query.getlist("op")
    limit = settings.SETTLE_BULK_MAX_ITEMS
    if picked:
        picks = picks_parse(picked[: limit + 1])
        if picks is None:
            return {"error": "The selection names something that is not an operation."}
        unique = {ident: version for ident, version in reversed(picks)}
        return {"by_hand": True, "picks": picks, "count": len(unique), "ops": picked}
    form = _filter_form(request, query)
    if form.errors:
        return {"error": "The filter is not one the queue offers.", "form": form}
    until = timezone.now()
    count = operations_matching_count_for_user(
        user=request.user, filters=form.filters(), until=until, cap=settings.SETTLE_BULK_MAX_ITEMS
    )
    filters = _filter_query(form)
    return {
        "by_hand": False,
        "count": count,
        "filters": filters,
        "query": urlencode(filters),
        "form": form,
        "until": moment_encode(until),
    }


def _offered(actor: Actor) -> list[dict[str, str]]:
    """The actions the preview offers: those ``actor`` may take somewhere."""
    permitted = bulk_actions_permitted(actor=actor)
    return [
        {"value": value, "label": label, "does": does}
        for value, label, does in ACTIONS
        if value in permitted
    ]


@login_required
@require_safe
def bulk_preview(request: HttpRequest) -> HttpResponse:
    """How many operations the selection holds, exactly, and the actions that apply."""
    selection = _selection(request, request.GET)
    actor = _actor(request)
    context = {
        **selection,
        "limit": settings.SETTLE_BULK_MAX_ITEMS,
        "actions": _offered(actor),
        "submit_form": BulkSubmitForm(),
    }
    return render(request, "console/bulk_preview.html", context)


@login_required
@require_POST
def bulk_submit_view(request: HttpRequest) -> HttpResponse:
    """Freeze the selection as a batch and open its page; bad input is said, never a 500."""
    form = BulkSubmitForm(request.POST)
    selection = _selection(request, request.POST)
    actor = _actor(request)
    problem = selection.get("error")
    if problem is None and not form.is_valid():
        problem = "Nothing was done: " + (
            "give a reason." if "why" in form.errors else "choose an action."
        )
    if problem is None:
        data = form.cleaned_data
        if selection["by_hand"]:
            picks = [Pick(ident, version) for ident, version in selection["picks"]]
            described = f"{selection['count']} picked by hand"
        else:
            pairs = operations_matching_for_user(
                user=request.user,
                filters=selection["form"].filters(),
                until=data["until"],
                limit=settings.SETTLE_BULK_MAX_ITEMS,
            )
            picks = [Pick(ident, version) for ident, version in pairs]
            described = "all matching: " + (selection["query"] or "the whole queue")
        try:
            batch = bulk_submit(
                action=data["action"],
                picks=picks,
                selection=described,
                reason=data["why"],
                actor=actor,
            )
        except RecoveryError as refusal:
            refusal_status_raise(refusal)
            problem = f"Nothing was done: {refusal.message}."
        else:
            if batch.status == BulkBatch.Status.PROPOSED:
                messages.success(
                    request,
                    f"Proposed: the void of {batch.total} operations waits for a second "
                    "person's approval.",
                )
            return redirect("bulk-batch", batch_id=batch.pk)
    context = {
        **selection,
        "problem": problem,
        "limit": settings.SETTLE_BULK_MAX_ITEMS,
        "actions": _offered(actor),
        "submit_form": form,
    }
    return render(request, "console/bulk_preview.html", context, status=400)


def _batch_for_viewer(request: HttpRequest, batch_id: uuid.UUID) -> BulkBatch:
    batch = bulk_batch_for_user(user=request.user, batch_id=batch_id)
    if batch is None:
        raise Http404("no such batch")
    return batch


def _may_decide(request: HttpRequest, batch: BulkBatch) -> bool:
    me = _actor(request)
    return (
        batch.status == BulkBatch.Status.PROPOSED
        and batch.proposed_by != me
        and bulk_approvable(batch=batch, actor=me)
    )


def _batch_context(request: HttpRequest, batch: BulkBatch) -> dict[str, Any]:
    counts = bulk_counts(batch_id=batch.pk)
    settled = counts[BulkItem.Status.DONE] + counts[BulkItem.Status.REFUSED]
    return {
        "batch": batch,
        "counts": counts,
        "settled": settled,
        "percent": round(100 * settled / batch.total) if batch.total else 100,
        "may_decide": _may_decide(request, batch),
        "mine": batch.proposed_by == _actor(request),
    }


@login_required
@require_safe
def bulk_batch(request: HttpRequest, batch_id: uuid.UUID) -> HttpResponse:
    """A batch: its progress while it runs (htmx polls ``#progress``), then its report."""
    batch = _batch_for_viewer(request, batch_id)
    context = _batch_context(request, batch)
    if request.htmx and request.GET.get("part") == "progress":  # type: ignore[attr-defined]
        response = render(request, "console/bulk_batch.html#progress", context)
        if batch.status != BulkBatch.Status.RUNNING:
            response["HX-Refresh"] = "true"  # over: the whole page, with its report
        return response
    items = bulk_items_for_user(user=request.user, batch=batch)
    # Refusals first: they are what the operator has to read.
    shown = list(items.exclude(status=BulkItem.Status.DONE)[:REPORT_SHOWN])
    if len(shown) < REPORT_SHOWN:
        shown += list(items.filter(status=BulkItem.Status.DONE)[: REPORT_SHOWN - len(shown)])
    context.update(
        items=shown, shown_limit=REPORT_SHOWN, form=DecisionForm(), visible=_visible(request)
    )
    if context["may_decide"]:  # what a signed decision would sign, and whether it must
        context.update(
            items_digest=bulk_items_digest(batch=batch),
            has_passkey=passkey_held(user=request.user),
            passkey_required=bulk_passkey_required(batch=batch),
            approve_label=f"approve all {batch.total} voids",
        )
    return render(request, "console/bulk_batch.html", context)


def _visible(request: HttpRequest) -> set[int]:
    """The providers whose operations' keys this user may read in a report.

    A proposer sees every item they sent, but an id they forged stays a bare number.
    """
    return set(providers_visible_to(user=request.user).values_list("pk", flat=True))


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@require_safe
def bulk_report_csv(request: HttpRequest, batch_id: uuid.UUID) -> StreamingHttpResponse:
    """Every item of the batch this user may see, one line each: the whole report."""
    batch = _batch_for_viewer(request, batch_id)
    items = bulk_items_for_user(user=request.user, batch=batch)
    writer = csv.writer(_Echo())
    visible = _visible(request)

    def lines() -> Any:
        yield writer.writerow(
            [
                "batch",
                "action",
                "operation_id",
                "operation_key",
                "version",
                "status",
                "code",
                "detail",
                "done_at",
            ]
        )
        for item in items.iterator(chunk_size=2000):
            operation = item.operation
            key = operation.key if operation and operation.provider_id in visible else ""
            done_at = item.done_at.isoformat() if item.done_at else ""
            yield writer.writerow(
                [
                    batch.pk,
                    batch.action,
                    item.operation_ref,
                    _cell(key),
                    item.version,
                    item.status,
                    item.code,
                    _cell(item.detail),
                    done_at,
                ]
            )

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="batch-{batch.pk}.csv"'
    return response


def _cell(text: str) -> str:
    """A cell a spreadsheet will not run as a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


@login_required
@require_safe
def bulk_batches(request: HttpRequest) -> HttpResponse:
    """The batches this user proposed or may see, newest first."""
    batches = list(bulk_batches_for_user(user=request.user).order_by("-created_at")[:100])
    return render(request, "console/bulk_batches.html", {"batches": batches})


@login_required
@require_POST
def bulk_decide_view(request: HttpRequest, batch_id: uuid.UUID, decision: str) -> HttpResponse:
    """Approve (then run) or reject a proposed void batch as a whole, with a reason."""
    batch = _batch_for_viewer(request, batch_id)
    form = DecisionForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        signature = signed_record(request, kind="bulk", subject=batch.pk, decision=decision)
        bulk_decide(
            batch_id=batch.pk,
            approve=decision == "approve",
            reason=reason,
            actor=_actor(request),
            signature=signature,
        )
    except SettleError as refusal:  # the service's refusal, or the signature's
        refusal_status_raise(refusal)
        messages.error(
            request, f"Refused ({refusal.code.value}): {refusal.message}. Nothing changed."
        )
    else:
        done = "Approved: the voids are under way" if decision == "approve" else "Rejected"
        messages.success(request, f"{done}.")
    return redirect("bulk-batch", batch_id=batch.pk)


@login_required
@require_POST
def bulk_sign(request: HttpRequest, batch_id: uuid.UUID) -> HttpResponse:
    """What the browser needs to sign approving or rejecting the batch (JSON)."""
    batch = _batch_for_viewer(request, batch_id)
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "reject"):
        return json_refusal(ErrorCode.INVALID_FIELD, "decision: approve or reject")
    if not _may_decide(request, batch):
        return json_refusal(ErrorCode.FORBIDDEN, "you may not decide this batch")
    signed = bulk_statement(batch=batch, decision=decision, actor=_actor(request))
    return signing_begin(request, subject=batch.pk, signed=signed)
