"""A delivery task: claiming due messages, sending them, recording as they arrive.

delivery
    Workers claim due messages under a lease (``webhook_messages_claim``), post them
    (``webhooks.send``) with no DB lock held, and record each outcome in one place
    (``webhooks.outcomes``). At least once, in order per (endpoint, operation), the same
    ``webhook-id`` on every attempt. Deliveries run on a Celery queue of their own
    (``SETTLE_WEBHOOK_QUEUE``), so a slow receiver holds only the workers of that queue.
recording
    The outcomes are recorded as they arrive (within ``RECORD_EVERY_SECONDS``, a few in
    one transaction) while the other sends go on, so a slow receiver delays nobody
    else's record, and a message recorded is not sent again. A free thread goes to the
    endpoint with the fewest sends under way.
deferred
    A message of an endpoint that timed out earlier in the same task is not sent: its
    claim is released and it waits as long as its endpoint's errors in a row call for,
    without an attempt counted. A receiver that accepts and never answers costs each
    task one timeout (on at most ``DELIVERY_THREADS`` threads at once), not one per
    message, and the other endpoints' messages go out meanwhile; once it is failing, its
    first success brings everything it was owed forward again.
unsent
    A task starts sends for ``DELIVERY_TASK_SECONDS`` (less if the timeout is long: its
    last deadline falls well inside the task's soft time limit), and none its claim's
    lease would not outlast: such a message's claim is released, due at once, without an
    attempt counted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from common.outbound import Target
from recovery.services.errors import Invalid
from webhooks.endpoints import endpoint_signers
from webhooks.models import WebhookEndpoint, WebhookMessage
from webhooks.outbox import payload_sent
from webhooks.outcomes import webhook_outcomes_record, webhook_waiting_promote
from webhooks.selectors import webhook_messages_due
from webhooks.send import (
    DELIVERY_THREADS,
    Claimed,
    Outcome,
    webhook_client,
    webhook_message_send,
    webhook_target,
)

PENDING = WebhookMessage.Status.PENDING
# A delivery task starts sends for this long at most; each ends by its deadline.
DELIVERY_TASK_SECONDS = 30.0
# What a task keeps of its soft time limit, past its last send's deadline, to record.
RECORD_MARGIN_SECONDS = 15.0
# Outcomes are recorded together once this many arrived or the first waited this long.
RECORD_BATCH = DELIVERY_THREADS * 2
RECORD_EVERY_SECONDS = 0.1


def _due(now: datetime) -> QuerySet[WebhookMessage]:
    earlier = WebhookMessage.objects.filter(
        endpoint=OuterRef("endpoint"),
        operation=OuterRef("operation"),
        status=PENDING,
        id__lt=OuterRef("id"),
    )
    return webhook_messages_due(now=now).filter(~Exists(earlier)).order_by("next_attempt_at", "id")


@transaction.atomic
def webhook_messages_claim(*, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` due messages under a lease; each is the first undelivered one
    of its (endpoint, operation), so messages of one operation go out in order.

    ``SKIP LOCKED``: workers claiming at once take different rows; a worker SIGKILLed
    after claiming leaves its claims to lapse at ``lease`` and be delivered again.
    """
    now = timezone.now()
    rows = list(
        _due(now)
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "msg_id", "payload", "endpoint_id", "operation_id", "created_at")[:limit]
    )
    if not rows:
        return []
    lease = now + timedelta(seconds=settings.SETTLE_WEBHOOK_LEASE_SECONDS)
    WebhookMessage.objects.filter(pk__in=[row[0] for row in rows]).update(lease_expires_at=lease)
    endpoints = WebhookEndpoint.objects.in_bulk({row[3] for row in rows})
    return [
        Claimed(
            id=pk,
            msg_id=msg_id,
            payload=payload_sent(payload),
            url=endpoints[endpoint_id].url,
            signers=endpoint_signers(endpoints[endpoint_id], now),
            endpoint_id=endpoint_id,
            operation_id=operation_id,
            created_at=created_at,
            lease=lease,
        )
        for pk, msg_id, payload, endpoint_id, operation_id, created_at in rows
    ]


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    deferred: int = 0
    unsent: int = 0

    def add(self, outcomes: Sequence[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.unsent:
                self.unsent += 1
            elif outcome.deferred:
                self.deferred += 1
            elif outcome.delivered:
                self.delivered += 1
            else:
                self.failed += 1


class _Sends:
    """One delivery task's sends: up to ``DELIVERY_THREADS`` under way, each outcome
    recorded as it arrives, more claimed as threads fall idle, none started after
    ``end`` (``time.monotonic``)."""

    def __init__(
        self, client: httpx.Client, pool: ThreadPoolExecutor, end: float, report: DeliveryReport
    ) -> None:
        self.client = client
        self.pool = pool
        self.end = end
        self.report = report
        self.timeout = float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS)
        self.waiting: list[Claimed] = []
        self.running: dict[Future[Outcome], Claimed] = {}
        self.busy: Counter[int] = Counter()  # endpoint id: its sends under way
        self.timed_out: set[int] = set()  # endpoints sent nothing more in this task
        self.targets: dict[str, Target | Invalid] = {}

    def _held(self) -> list[Outcome]:
        """The waiting messages that will not be sent in this task, taken out. A timed-out
        endpoint's are deferred once none of its sends is under way, so that their wait
        counts every timeout of this task."""
        lease_needed = timezone.now() + timedelta(seconds=self.timeout)
        in_time = time.monotonic() <= self.end
        held: list[Outcome] = []
        keep: list[Claimed] = []
        for item in self.waiting:
            if item.endpoint_id in self.timed_out:
                if self.busy[item.endpoint_id]:
                    keep.append(item)
                else:
                    held.append(Outcome(item, None, deferred=True))
            elif not in_time or item.lease < lease_needed:
                held.append(Outcome(item, None, unsent=True))
            else:
                keep.append(item)
        self.waiting = keep
        return held

    def _startable(self) -> list[Claimed]:
        return [item for item in self.waiting if item.endpoint_id not in self.timed_out]

    def _start(self) -> None:
        startable = self._startable()
        while startable and len(self.running) < DELIVERY_THREADS:
            # The first message of the endpoint with the fewest sends under way: a slow
            # endpoint never takes a thread another endpoint's message is waiting for.
            item = min(startable, key=lambda waiting: self.busy[waiting.endpoint_id])
            startable.remove(item)
            self.waiting.remove(item)
            future = self.pool.submit(self._send, item)
            self.running[future] = item
            self.busy[item.endpoint_id] += 1

    def _send(self, item: Claimed) -> Outcome:
        # Resolved on the delivery thread, once per URL per task: a slow name server
        # holds that thread, never the loop that records the others' outcomes.
        if item.url not in self.targets:
            self.targets[item.url] = webhook_target(item.url)
        return webhook_message_send(item, self.client, self.targets[item.url])

    def _record(self, outcomes: list[Outcome]) -> None:
        if outcomes:
            webhook_outcomes_record(outcomes)
            self.report.add(outcomes)

    def run(self, claimed: list[Claimed]) -> None:
        self.waiting = claimed
        claiming = True  # until a claim finds nothing, and again after each outcome
        arrived: list[Outcome] = []  # not yet recorded
        arrived_since = 0.0

        def flush() -> None:
            self._record(arrived)
            arrived.clear()

        while True:
            held = self._held()
            self._start()
            self._record(held)
            idle = len(self.running) < DELIVERY_THREADS and not self._startable()
            if claiming and idle and time.monotonic() <= self.end:
                flush()  # first: an outcome may make its operation's next message due
                more = webhook_messages_claim(limit=settings.SETTLE_WEBHOOK_BATCH)
                self.waiting += more
                claiming = bool(more)
                if more:
                    continue
            if not self.running:
                flush()
                if self.waiting:  # a timed-out endpoint's, deferred on the next pass
                    continue
                return
            patience = None
            if arrived:
                patience = max(arrived_since + RECORD_EVERY_SECONDS - time.monotonic(), 0.0)
            done, _ = wait(self.running, timeout=patience, return_when=FIRST_COMPLETED)
            for future in done:
                item = self.running.pop(future)
                self.busy[item.endpoint_id] -= 1
                outcome = future.result()
                if outcome.timed_out:
                    self.timed_out.add(item.endpoint_id)
                if not arrived:
                    arrived_since = time.monotonic()
                arrived.append(outcome)
                claiming = True  # the next message of each operation done is due now
            late = arrived and time.monotonic() - arrived_since >= RECORD_EVERY_SECONDS
            if late or len(arrived) >= RECORD_BATCH:
                flush()


def webhooks_deliver(
    *, seconds: float = DELIVERY_TASK_SECONDS, promote: bool = True
) -> DeliveryReport:
    """Claim, send and record until nothing is due; start no send after ``seconds``.

    ``seconds`` is cut so that the last send's deadline falls ``RECORD_MARGIN_SECONDS``
    inside the task's soft time limit: no task of sends ever reaches it. ``promote``:
    first make due what waits behind nothing (``webhook_waiting_promote``); beat's round
    does, a commit's nudge need not.
    """
    report = DeliveryReport()
    if promote:
        webhook_waiting_promote()
    began = time.monotonic()
    soft_limit = float(settings.CELERY_TASK_SOFT_TIME_LIMIT)
    timeout = float(settings.SETTLE_WEBHOOK_TIMEOUT_SECONDS)
    end = began + min(seconds, soft_limit - RECORD_MARGIN_SECONDS - timeout)
    claimed = webhook_messages_claim(limit=settings.SETTLE_WEBHOOK_BATCH)
    if not claimed:  # beat's usual round: no client, no threads
        return report
    with webhook_client() as client, ThreadPoolExecutor(DELIVERY_THREADS) as pool:
        _Sends(client, pool, end, report).run(claimed)
    return report
