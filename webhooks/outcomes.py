"""What each attempt leaves behind, and an operator's redelivery.

retry
    A message not delivered is tried again after ``backoff_seconds`` (exponential, with
    jitter) until ``SETTLE_WEBHOOK_RETRY_HOURS`` have passed since it was written; then
    it is given up (``failed``), and an operator may redeliver it.
endpoint health
    An endpoint's errors in a row mark it failing; its next success clears that and, if
    it was failing, brings its waiting messages forward. A receiver answering 410
    disables its endpoint.
order
    A message done (delivered or given up) makes the next waiting one of its (endpoint,
    operation) due (``_next_promote``; beat's ``webhook_waiting_promote`` finds any a
    race left behind).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from audit.chain import audit_append, audit_transaction
from audit.kinds import AuditKind
from common.actors import Actor
from common.errors import ErrorCode
from recovery.permissions import ProviderPermission
from recovery.services.access import provider_permission_require
from recovery.services.errors import NotFound
from webhooks.metrics import WEBHOOK_DELIVERIES
from webhooks.models import WebhookEndpoint, WebhookMessage
from webhooks.outbox import webhooks_nudge
from webhooks.send import Claimed, Outcome

ENABLED = WebhookEndpoint.Status.ENABLED
FAILING = WebhookEndpoint.Status.FAILING
DISABLED = WebhookEndpoint.Status.DISABLED
PENDING = WebhookMessage.Status.PENDING
DELIVERED = WebhookMessage.Status.DELIVERED
FAILED = WebhookMessage.Status.FAILED

# Back-off: 5 s doubled per attempt up to an hour, each delay jittered by ±25 %.
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 3600.0
BACKOFF_JITTER = 0.25


def backoff_seconds(attempts: int) -> float:
    """The wait after the ``attempts``-th failed attempt: doubling, capped, jittered."""
    base = min(BACKOFF_FIRST_SECONDS * 2.0 ** max(attempts - 1, 0), BACKOFF_MAX_SECONDS)
    return base * random.uniform(1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER)


@transaction.atomic
def webhook_outcomes_record(outcomes: Sequence[Outcome]) -> None:
    """Record what each attempt got; the one place every delivery outcome passes.

    Delivered: done. Otherwise retried after ``backoff_seconds`` until the retry window
    closes (then ``failed``). An endpoint's errors in a row mark it failing; its next
    success clears that and, if it was failing, brings its waiting messages forward;
    410 disables it.
    Deferred (not sent): the claim released, due after its endpoint's back-off. Unsent:
    the claim released, due at once. Only a claim still held is recorded: one that
    lapsed belongs to another worker now.
    """
    now = timezone.now()
    window = timedelta(hours=settings.SETTLE_WEBHOOK_RETRY_HOURS)
    succeeded: set[int] = set()
    failed: dict[int, int] = {}
    gone: set[int] = set()
    by_code: dict[tuple[int, datetime], list[int]] = {}
    done: set[tuple[int, int]] = set()
    tally: dict[str, int] = {}
    deferred: dict[int, list[Claimed]] = {}
    unsent: list[Claimed] = []
    for outcome in outcomes:
        if outcome.unsent:
            tally["unsent"] = tally.get("unsent", 0) + 1
            unsent.append(outcome.claimed)
            continue
        if outcome.deferred:
            tally["deferred"] = tally.get("deferred", 0) + 1
            deferred.setdefault(outcome.claimed.endpoint_id, []).append(outcome.claimed)
            continue
        if outcome.delivered:
            tally["delivered"] = tally.get("delivered", 0) + 1
            key = (int(outcome.status_code or 0), outcome.claimed.lease)
            by_code.setdefault(key, []).append(outcome.claimed.id)
            done.add((outcome.claimed.endpoint_id, outcome.claimed.operation_id))
            succeeded.add(outcome.claimed.endpoint_id)
            continue
        claimed = outcome.claimed
        message = WebhookMessage.objects.filter(
            pk=claimed.id, status=PENDING, lease_expires_at=claimed.lease
        )
        attempts = message.values_list("attempts", flat=True).first()
        if attempts is None:
            continue
        attempts += 1
        given_up = now - claimed.created_at >= window
        message.update(
            attempts=attempts,
            status=FAILED if given_up else PENDING,
            next_attempt_at=now + timedelta(seconds=backoff_seconds(attempts)),
            lease_expires_at=None,
            last_status_code=outcome.status_code,
            last_error=outcome.error or f"HTTP {outcome.status_code}",
            last_attempt_at=now,
        )
        label = "given_up" if given_up else "retrying"
        tally[label] = tally.get(label, 0) + 1
        if given_up:
            done.add((claimed.endpoint_id, claimed.operation_id))
        failed[claimed.endpoint_id] = failed.get(claimed.endpoint_id, 0) + 1
        if outcome.status_code == 410:
            gone.add(claimed.endpoint_id)
    for (code, lease), ids in by_code.items():
        WebhookMessage.objects.filter(pk__in=ids, status=PENDING, lease_expires_at=lease).update(
            attempts=F("attempts") + 1,
            status=DELIVERED,
            delivered_at=now,
            lease_expires_at=None,
            last_status_code=code,
            last_error="",
            last_attempt_at=now,
        )
    _next_promote(done, now)
    _endpoints_update(now, succeeded, failed, gone)
    _deferred_release(now, deferred)
    for lease in {claim.lease for claim in unsent}:
        WebhookMessage.objects.filter(
            pk__in=[claim.id for claim in unsent if claim.lease == lease],
            status=PENDING,
            lease_expires_at=lease,
        ).update(lease_expires_at=None)
    transaction.on_commit(lambda: _deliveries_count(tally))


def _deferred_release(now: datetime, deferred: dict[int, list[Claimed]]) -> None:
    """Release the claims of messages not sent, due again after their endpoint's back-off
    (its errors in a row, counted already): a dead receiver's backlog waits together
    while the messages that timed out probe it on their own back-off."""
    failures = dict(
        WebhookEndpoint.objects.filter(pk__in=list(deferred)).values_list("id", "failures")
    )
    for endpoint_id, claims in deferred.items():
        wait = timedelta(seconds=backoff_seconds(max(failures.get(endpoint_id, 0), 1)))
        for lease in {claim.lease for claim in claims}:
            WebhookMessage.objects.filter(
                pk__in=[claim.id for claim in claims if claim.lease == lease],
                status=PENDING,
                lease_expires_at=lease,
            ).update(
                next_attempt_at=now + wait,
                lease_expires_at=None,
                last_error="not sent: the endpoint timed out earlier in this delivery task",
            )


def _deliveries_count(tally: dict[str, int]) -> None:
    for outcome, count in tally.items():
        WEBHOOK_DELIVERIES.labels(outcome=outcome).inc(count)


def _next_promote(pairs: set[tuple[int, int]], now: datetime) -> None:
    """The next waiting message of each (endpoint, operation) whose head is done is due."""
    if not pairs:
        return
    table = WebhookMessage._meta.db_table
    placeholders = ", ".join(["(%s, %s)"] * len(pairs))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET next_attempt_at = %s WHERE id IN (SELECT MIN(id) FROM {table} "
            "WHERE status = %s AND next_attempt_at IS NULL "
            f"AND (endpoint_id, operation_id) IN ({placeholders}) "
            "GROUP BY endpoint_id, operation_id)",
            [now, PENDING, *(value for pair in sorted(pairs) for value in pair)],
        )


def webhook_waiting_promote() -> int:
    """Make due every waiting message with nothing pending before it; how many.

    A message written while its predecessor was being delivered can miss that
    delivery's promotion (neither transaction saw the other's row); beat's round finds
    it here. Reads only waiting rows.
    """
    earlier = WebhookMessage.objects.filter(
        endpoint=OuterRef("endpoint"),
        operation=OuterRef("operation"),
        status=PENDING,
        id__lt=OuterRef("id"),
    )
    return (
        WebhookMessage.objects.filter(status=PENDING, next_attempt_at__isnull=True)
        .filter(~Exists(earlier))
        .update(next_attempt_at=timezone.now())
    )


def _endpoints_update(
    now: datetime, succeeded: set[int], failed: dict[int, int], gone: set[int]
) -> None:
    for endpoint_id in succeeded - set(failed):
        was_failing = WebhookEndpoint.objects.filter(pk=endpoint_id, status=FAILING).update(
            failures=0, status=ENABLED
        )
        WebhookEndpoint.objects.filter(pk=endpoint_id, failures__gt=0).update(failures=0)
        if was_failing:
            # The receiver is back: what waits for it need not sit out its back-off. Only
            # after an outage (failing): a message refused on its own keeps its back-off
            # while the endpoint's others succeed.
            WebhookMessage.objects.filter(
                endpoint_id=endpoint_id, status=PENDING, next_attempt_at__gt=now
            ).update(next_attempt_at=now)
    for endpoint_id, count in failed.items():
        WebhookEndpoint.objects.filter(pk=endpoint_id).update(failures=F("failures") + count)
        WebhookEndpoint.objects.filter(
            pk=endpoint_id, status=ENABLED, failures__gte=settings.SETTLE_WEBHOOK_FAILING_AFTER
        ).update(status=FAILING)
    if gone:
        WebhookEndpoint.objects.filter(pk__in=gone).update(
            status=DISABLED, disabled_reason="the receiver answered 410 Gone"
        )


@audit_transaction()
def webhook_message_redeliver(*, message_id: int, actor: Actor) -> WebhookMessage:
    """Send a message again, with its same ``webhook-id``: due now, its attempts kept.

    Allowed to an operator (``lookup_operations``) of the message's operation's provider;
    a user who may not view that provider is told it does not exist.
    """
    message = (
        WebhookMessage.objects.select_for_update(of=("self",))
        .select_related("operation__provider", "endpoint")
        .filter(pk=message_id)
        .first()
    )
    if message is None:
        raise NotFound(ErrorCode.UNKNOWN_WEBHOOK_MESSAGE, "no such webhook message")
    provider_permission_require(
        actor=actor,
        provider=message.operation.provider,
        permission=ProviderPermission.LOOKUP_OPERATIONS,
        action="redeliver webhooks of",
        missing=ErrorCode.UNKNOWN_WEBHOOK_MESSAGE,
    )
    message.status = PENDING
    message.next_attempt_at = timezone.now()
    message.lease_expires_at = None
    message.save(update_fields=["status", "next_attempt_at", "lease_expires_at"])
    audit_append(
        kind=AuditKind.WEBHOOK_REDELIVERED,
        actor=actor,
        data={
            "message_id": message.pk,
            "msg_id": message.msg_id,
            "endpoint_id": message.endpoint_id,
            "operation": message.operation.key,
        },
    )
    transaction.on_commit(webhooks_nudge)
    return message
