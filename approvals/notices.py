"""Reaching the people who decide: approvals' messages, grouped per channel, via Apprise.

channel
    An Apprise URL in the file ``SETTLE_APPROVAL_NOTIFY_CONFIG`` names, with its tags.
    An approval's ``notify_groups`` are the tags it is announced, reminded and expired
    to (none: the tag ``approvers``); its ``escalate_groups`` the tags it escalates to.
notice
    One message owed to one tag about one approval (``ApprovalNotice``):
    ``opened``; ``reminder``, at ``remind_at`` (or ``SETTLE_APPROVAL_REMIND_MINUTES``
    after it opened); ``escalation``, at ``escalate_at`` (or
    ``SETTLE_APPROVAL_ESCALATE_MINUTES`` after), only if it has escalation groups;
    ``expired``, written with the expiry itself (``approval_expired_notices_record``,
    called by ``recovery.services.approval_expiry``), in its transaction.
parameters
    Each message shows the operation's parameters, which are not this app's: whoever
    runs it hands over a lookup of them by operation key (``ParamsOf``; beat's task,
    ``monitoring.tasks.approval_notices``, gives ``recovery.selectors``' one).

A run (beat, every minute; running more often, or twice at once, is safe):

claim
    Pending approvals owed a message, locked ``SKIP LOCKED``: each one's ``notified_at``,
    ``reminded_at``, ``escalated_at`` set by a compare-and-set on their being unset, and
    its notices written, in one transaction. Two runs never claim one message twice.
    An approval opened after its reminder was due (beat was down) is announced, and
    its reminder counted as said: the opening message says the same, more recently.
send
    The due notices taken for a while (``claimed_until``) in a short transaction, then,
    after the commit, outside any transaction: one message per tag listing every
    approval that tag is owed news of (a burst of fifty approvals is one message per
    tag), each with its action, provider, host, parameters in a line and a link to its
    page. Delivered: marked sent. Not: logged, the error kept on each notice
    (``send_error``), and sent again by the next run; after a day it is dropped.

No configuration, no run: nothing is claimed, written or sent.

Approval rows are locked here without their operations, against the lock order
(``recovery.services.locking``): a run never waits for a row (``SKIP LOCKED``) and
takes no other lock after them, so it cannot join a cycle; a decision waits for it at
most the length of a claim.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval, ApprovalNotice
from common.notify import apprise_notify

logger = logging.getLogger(__name__)

Kind = ApprovalNotice.Kind
PENDING = Approval.Status.PENDING
DEFAULT_TAG = "approvers"
CLAIM_BATCH = 500
# A run that took notices and died leaves them to the next run after this.
SEND_LEASE = timedelta(minutes=5)
# News of an approval a day late tells nobody anything they can still act on.
GIVE_UP = timedelta(days=1)
# A message lists this many approvals at most, and says how many more there are.
LISTED = 50
PARAMS_LINE = 100

# Each operation's parameters as canonical JSON, by operation key (those it knows of).
ParamsOf = Callable[[Collection[str]], Mapping[str, str]]

HEADINGS = {
    Kind.OPENED: ("waiting", "Waiting for a decision"),
    Kind.REMINDER: ("still waiting", "Still waiting for a decision"),
    Kind.ESCALATION: ("escalated", "Escalated: nobody decided in time"),
    Kind.EXPIRED: ("expired", "Expired: nobody decided in time"),
}


@dataclass(frozen=True)
class NoticeMessage:
    """One message to one tag, and the notices it carries."""

    tag: str
    title: str
    body: str
    notice_ids: list[int]
    delivered: bool = False


@dataclass
class NoticesReport:
    approvals_claimed: int = 0
    messages: list[NoticeMessage] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return sum(message.delivered for message in self.messages)


def approval_notices_run(*, params_of: ParamsOf, now: datetime | None = None) -> NoticesReport:
    """Claim what approvers are owed, then send every due notice, grouped per tag."""
    report = NoticesReport()
    config = settings.SETTLE_APPROVAL_NOTIFY_CONFIG
    if not config:
        return report
    now = now or timezone.now()
    while True:
        claimed = approval_notices_claim(now=now, limit=CLAIM_BATCH)
        report.approvals_claimed += claimed
        if claimed < CLAIM_BATCH:
            break
    report.messages = approval_notices_send(now=now, config=config, params_of=params_of)
    return report


def _tags(groups: Sequence[str], *, default: str | None = DEFAULT_TAG) -> list[str]:
    tags = sorted({str(group).strip() for group in groups if str(group).strip()})
    return tags or ([default] if default else [])


def _due(at: datetime | None, opened: datetime, minutes: int, now: datetime) -> bool:
    return (at if at is not None else opened + timedelta(minutes=minutes)) <= now


@transaction.atomic
def approval_notices_claim(*, now: datetime, limit: int) -> int:
    """One batch of pending approvals owed a message: marked, their notices written; how
    many approvals this run won."""
    remind = settings.SETTLE_APPROVAL_REMIND_MINUTES
    escalate = settings.SETTLE_APPROVAL_ESCALATE_MINUTES
    remind_due = Q(remind_at__lte=now) | Q(
        remind_at__isnull=True, created_at__lte=now - timedelta(minutes=remind)
    )
    escalate_due = (
        Q(escalate_at__lte=now)
        | Q(escalate_at__isnull=True, created_at__lte=now - timedelta(minutes=escalate))
    ) & ~Q(escalate_groups=[])
    owed = (
        Q(notified_at__isnull=True)
        | (Q(reminded_at__isnull=True) & remind_due)
        | (Q(escalated_at__isnull=True) & escalate_due)
    )
    # One whose decision is no longer wanted is the expiry's to announce, not ours.
    live = Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    approvals = list(
        Approval.objects.filter(owed, live, status=PENDING)
        # NO KEY: a permit or vote inserted for the approval meanwhile need not wait.
        .select_for_update(skip_locked=True, no_key=True)
        .order_by("created_at", "id")[:limit]
    )
    notices: list[ApprovalNotice] = []
    for approval in approvals:
        marks: dict[str, datetime] = {}
        kinds: list[str] = []
        reminder_due = _due(approval.remind_at, approval.created_at, remind, now)
        if approval.notified_at is None:
            marks["notified_at"] = now
            kinds.append(Kind.OPENED)
            if reminder_due and approval.reminded_at is None:
                marks["reminded_at"] = now
        elif approval.reminded_at is None and reminder_due:
            marks["reminded_at"] = now
            kinds.append(Kind.REMINDER)
        if (
            approval.escalated_at is None
            and approval.escalate_groups
            and _due(approval.escalate_at, approval.created_at, escalate, now)
        ):
            marks["escalated_at"] = now
            kinds.append(Kind.ESCALATION)
        if not marks:
            continue
        # Under the row's lock (SQLite: one writer at a time), and compared anyway, so
        # that sending once never rests on the lock alone.
        unset = {f"{name}__isnull": True for name in marks}
        if Approval.objects.filter(pk=approval.pk, status=PENDING, **unset).update(**marks) != 1:
            continue
        for kind in kinds:
            groups = approval.escalate_groups if kind == Kind.ESCALATION else approval.notify_groups
            notices += [
                ApprovalNotice(approval=approval, kind=kind, tag=tag, created_at=now)
                for tag in _tags(groups, default=None if kind == Kind.ESCALATION else DEFAULT_TAG)
            ]
    # Once per (approval, kind, tag), whatever else wrote one.
    ApprovalNotice.objects.bulk_create(notices, ignore_conflicts=True)
    return len({notice.approval_id for notice in notices})


def approval_expired_notices_record(*, approval_ids: Collection[uuid.UUID]) -> None:
    """Approvals that expired undecided are owed an ``expired`` notice to the tags they
    were announced to; written in the expiry's transaction, so a rollback takes it back."""
    if not settings.SETTLE_APPROVAL_NOTIFY_CONFIG or not approval_ids:
        return
    expired = list(approval_ids)
    now = timezone.now()
    ApprovalNotice.objects.bulk_create(
        [
            ApprovalNotice(approval_id=pk, kind=Kind.EXPIRED, tag=tag, created_at=now)
            for pk, groups in Approval.objects.filter(pk__in=expired).values_list(
                "pk", "notify_groups"
            )
            for tag in _tags(groups)
        ],
        ignore_conflicts=True,
    )


def _notices_take(*, now: datetime) -> list[ApprovalNotice]:
    """The due notices, taken until ``now + SEND_LEASE`` by this run; stale ones dropped."""
    with transaction.atomic():
        due = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
        notices = list(
            ApprovalNotice.objects.filter(due, status=ApprovalNotice.Status.PENDING)
            .select_for_update(skip_locked=True, of=("self",))
            .select_related("approval")
            .order_by("created_at", "id")[: CLAIM_BATCH * 4]
        )
        dropped, taken = [], []
        for notice in notices:
            # An opening, reminder or escalation about a decided approval, or any news
            # a day late, is no news: dropped, its error (if any) kept.
            decided = notice.kind != Kind.EXPIRED and notice.approval.status != PENDING
            if decided or notice.created_at <= now - GIVE_UP:
                dropped.append(notice.pk)
            else:
                taken.append(notice)
        if dropped:
            ApprovalNotice.objects.filter(pk__in=dropped).update(
                status=ApprovalNotice.Status.DROPPED, claimed_until=None
            )
        ids = [notice.pk for notice in taken]
        # Compared again, so that sending once never rests on the lock alone: should
        # another run have taken one meanwhile, this run sends nothing rather than twice.
        won = ApprovalNotice.objects.filter(due, pk__in=ids, status=ApprovalNotice.Status.PENDING)
        if won.update(claimed_until=now + SEND_LEASE) != len(ids):
            raise RuntimeError("approval notices taken by another run meanwhile")
    return taken


def approval_notices_send(
    *, now: datetime, config: str, params_of: ParamsOf
) -> list[NoticeMessage]:
    """Send every due notice, one message per tag, after the commit; the messages."""
    by_tag: dict[str, list[ApprovalNotice]] = {}
    for notice in _notices_take(now=now):
        by_tag.setdefault(notice.tag, []).append(notice)
    if not by_tag:
        return []
    params = _params(
        params_of(
            {notice.approval.operation_key for notices in by_tag.values() for notice in notices}
        )
    )
    sent = []
    for tag, notices in sorted(by_tag.items()):
        message = _message(tag, notices, params)
        try:
            delivered = apprise_notify(
                config=config, tag=tag, title=message.title, body=message.body
            )
        except Exception:  # one channel's failure must not keep the others' messages
            logger.exception("approval notices: sending to tag %r failed", tag)
            delivered = False
        _delivered(message, delivered, now)
        sent.append(NoticeMessage(tag, message.title, message.body, message.notice_ids, delivered))
    return sent


def _delivered(message: NoticeMessage, delivered: bool, now: datetime) -> None:
    """Record the outcome on the message's notices; an undelivered one is due again."""
    notices = ApprovalNotice.objects.filter(pk__in=message.notice_ids)
    if delivered:
        notices.update(
            status=ApprovalNotice.Status.SENT,
            sent_at=now,
            claimed_until=None,
            send_error="",
            attempts=F("attempts") + 1,
        )
        return
    error = f"{now.isoformat()}: Apprise could not deliver to tag {message.tag!r}"
    logger.error("approval notices: %s (%d notices)", error, len(message.notice_ids))
    notices.update(claimed_until=None, send_error=error, attempts=F("attempts") + 1)


def _params(canonical_by_key: Mapping[str, str]) -> dict[str, str]:
    """Each operation's parameters in one line, by operation key."""
    lines = {}
    for key, canonical in canonical_by_key.items():
        try:
            params = json.loads(canonical)
        except ValueError:
            params = canonical
        if isinstance(params, dict):
            line = ", ".join(
                f"{name}={value if isinstance(value, str) else json.dumps(value)}"
                for name, value in params.items()
            )
        else:
            line = json.dumps(params)
        lines[key] = line if len(line) <= PARAMS_LINE else line[: PARAMS_LINE - 1] + "…"
    return lines


def _message(tag: str, notices: list[ApprovalNotice], params: dict[str, str]) -> NoticeMessage:
    """One message for ``tag``: a section per kind, a line and a link per approval."""
    by_kind: dict[str, list[Approval]] = {}
    for notice in notices:
        by_kind.setdefault(notice.kind, []).append(notice.approval)
    counts, sections, listed = [], [], 0
    for kind, (label, heading) in HEADINGS.items():
        approvals = by_kind.get(kind, [])
        if not approvals:
            continue
        counts.append(f"{len(approvals)} {label}")
        lines = [f"{heading}:"]
        for approval in approvals:
            if listed == LISTED:
                break
            listed += 1
            host = f" for {approval.host}" if approval.host else ""
            link = settings.SETTLE_CONSOLE_URL + reverse("approval", args=[approval.id])
            lines.append(f"- {approval.action} on {approval.provider}{host}")
            lines.append(f"  {params.get(approval.operation_key, '')}")
            lines.append(f"  {link}")
        sections.append("\n".join(lines))
    more = len(notices) - listed
    if more > 0:
        sections.append(f"…and {more} more; see the console.")
    return NoticeMessage(
        tag=tag,
        title="Settle approvals: " + ", ".join(counts),
        body="\n\n".join(sections),
        notice_ids=[notice.pk for notice in notices],
    )
