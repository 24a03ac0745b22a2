"""Webhook endpoints and their deliveries; an operator redelivers one.

Who sees what is the selectors' rule (``webhooks.selectors``): the endpoints to
any user with a role on some provider, their URLs in full only to who may configure
endpoints, each endpoint's deliveries only for the operations they may view.
Redelivering is the service's rule: an operator (``lookup_operations``) of the
message's operation's provider.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST, require_safe

from common.actors import Actor
from console.views.access import refusal_status_raise
from recovery.permissions import ProviderPermission
from recovery.selectors.access import providers_for_user
from recovery.services.errors import RecoveryError
from webhooks.endpoints import endpoint_events
from webhooks.models import WebhookEndpoint
from webhooks.outcomes import webhook_message_redeliver
from webhooks.selectors import (
    webhook_endpoints_for_user,
    webhook_messages_for_user,
    webhook_url_for_user,
)


def _endpoint_for_viewer(request: HttpRequest, endpoint_id: int) -> WebhookEndpoint:
    endpoint = webhook_endpoints_for_user(user=request.user).filter(pk=endpoint_id).first()
    if endpoint is None:
        raise Http404("no such webhook endpoint")
    return endpoint


@login_required
@require_safe
def webhook_endpoints(request: HttpRequest) -> HttpResponse:
    endpoints = [
        (
            endpoint,
            endpoint_events(endpoint) if endpoint.events else ["every event"],
            webhook_url_for_user(user=request.user, url=endpoint.url),
        )
        for endpoint in webhook_endpoints_for_user(user=request.user)
    ]
    return render(request, "console/webhooks.html", {"endpoints": endpoints})


@login_required
@require_safe
def webhook_endpoint(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint_for_viewer(request, endpoint_id)
    operable = set(
        providers_for_user(
            user=request.user, permissions=(ProviderPermission.LOOKUP_OPERATIONS,)
        ).values_list("pk", flat=True)
    )
    context = {
        "endpoint": endpoint,
        "url": webhook_url_for_user(user=request.user, url=endpoint.url),
        "events": endpoint_events(endpoint) if endpoint.events else ["every event"],
        "deliveries": webhook_messages_for_user(user=request.user, endpoint=endpoint),
        "operable": operable,
    }
    return render(request, "console/webhook_endpoint.html", context)


@login_required
@require_POST
def webhook_redeliver(request: HttpRequest, endpoint_id: int, message_id: int) -> HttpResponse:
    endpoint = _endpoint_for_viewer(request, endpoint_id)
    if not endpoint.messages.filter(pk=message_id).exists():
        raise Http404("no such delivery")
    try:
        message = webhook_message_redeliver(
            message_id=message_id, actor=Actor.of("user", request.user)
        )
    except RecoveryError as exc:
        refusal_status_raise(exc)
        messages.error(request, f"Refused: {exc.message}.")
    else:
        messages.success(request, f"Queued again: {message.event} {message.msg_id}.")
    return redirect("webhook-endpoint", endpoint_id=endpoint.pk)
