"""Webhook endpoints and their deliveries, as a console user may see them.

Endpoints belong to hosts, which serve every provider, so their list (host, URL, events,
status; never a secret) is shown to any user with a role on some provider; the
deliveries of each are only those of operations on providers the user may view. A URL
may carry a token in its path or query, so it is shown in full only to who may configure
endpoints (``webhook_url_for_user``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from recovery.selectors.access import providers_visible_to
from webhooks.models import WebhookEndpoint, WebhookMessage, webhook_url_redacted


def webhook_endpoints_for_user(*, user: Any) -> QuerySet[WebhookEndpoint]:
    if not providers_visible_to(user=user).exists():
        return WebhookEndpoint.objects.none()
    return WebhookEndpoint.objects.select_related("host").order_by("host__name", "id")


# Who may add, rotate and disable endpoints (the admin's) may read their URLs in full.
CONFIGURE_PERMISSION = "webhooks.change_webhookendpoint"


def webhook_url_for_user(*, user: Any, url: str) -> str:
    """``url`` as ``user`` may read it: in full with ``CONFIGURE_PERMISSION``, else redacted."""
    return url if user.has_perm(CONFIGURE_PERMISSION) else webhook_url_redacted(url)


def webhook_messages_for_user(
    *, user: Any, endpoint: WebhookEndpoint, limit: int = 100
) -> QuerySet[WebhookMessage]:
    """The endpoint's newest deliveries of operations ``user`` may view."""
    return (
        WebhookMessage.objects.filter(
            endpoint=endpoint, operation__provider__in=providers_visible_to(user=user)
        )
        .select_related("operation__provider")
        .order_by("-id")[:limit]
    )


def webhook_outbox_backlog() -> int:
    """Messages not yet delivered nor given up (pending), for metrics."""
    return WebhookMessage.objects.filter(status=WebhookMessage.Status.PENDING).count()


def webhook_messages_due(*, now: datetime) -> QuerySet[WebhookMessage]:
    """The messages due by ``now``: pending, their attempt due, held by no live claim,
    their endpoint not disabled (a disabled endpoint's messages wait by design)."""
    return (
        WebhookMessage.objects.filter(status=WebhookMessage.Status.PENDING)
        .filter(next_attempt_at__lte=now)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .exclude(endpoint__status=WebhookEndpoint.Status.DISABLED)
    )


def webhook_oldest_due_at(*, now: datetime) -> datetime | None:
    """When the longest-waiting due message (``webhook_messages_due``) became due.

    No worker consuming ``SETTLE_WEBHOOK_QUEUE`` makes this age grow without bound; a
    receiver that is down does not (its messages wait for their back-off, not yet due).
    Read from the ``webhook_message_due`` index, oldest first.
    """
    return (
        webhook_messages_due(now=now)
        .order_by("next_attempt_at")
        .values_list("next_attempt_at", flat=True)
        .first()
    )
