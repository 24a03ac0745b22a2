"""Verifications on the record: the routine one, the full job in slices, and the status.

``audit_verification_incremental`` verifies what the checkpoints signed since the last
verified one; ``audit_verify_job_step`` runs one bounded slice of a full verification
(``AuditVerifyJob``); each outcome is an ``AuditVerification`` that the console shows.
The walk itself, over every chain and checkpoint, is ``audit.verify_walk``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.utils import timezone

from audit.hashing import GENESIS_HASH, ChainBreak, event_columns, event_rows
from audit.models import (
    AuditCheckpoint,
    AuditEvent,
    AuditVerification,
    AuditVerifyJob,
)
from audit.seal import signed_by_key
from audit.seal_verify import _checkpoints_verified
from audit.signed_decisions import EventChecks
from audit.verify_walk import (
    _AFTER_CHAIN,
    VerifyTally,
    _alarms_disagree,
    _chains_verified,
    _rest_verified,
    _stored_heads_disagree,
    audit_verify,
)


@dataclass(frozen=True)
class AuditStatus:
    """What the newest checkpoint covers, for the command and the console."""

    events: int
    chains: int
    checkpoint: AuditCheckpoint | None


def audit_checkpoint_newest() -> AuditCheckpoint | None:
    """The newest checkpoint, without its heads (a first checkpoint's name every chain)."""
    return AuditCheckpoint.objects.defer("heads", "broken").order_by("-number").first()


def audit_status() -> AuditStatus:
    latest = audit_checkpoint_newest()
    events = AuditEvent.objects.count()
    chains = AuditEvent.objects.values("operation_key").distinct().count()
    return AuditStatus(events=events, chains=chains, checkpoint=latest)


def audit_verification_run(
    *, chunk_size: int = 5000, tally: VerifyTally | None = None
) -> AuditVerification:
    """Verify the whole log in one go (``audit_verify``) and keep the outcome.

    The record is written whether or not a problem was found: a broken log must show
    as broken, not as "last verified" at an earlier, intact moment. ``verify_audit``'s.
    """
    started = timezone.now()
    tally = tally if tally is not None else VerifyTally()
    newest = _newest_checkpoint_number()
    problem = next(iter(audit_verify(chunk_size=chunk_size, tally=tally)), None)
    return AuditVerification.objects.create(
        at=started,
        ok=problem is None,
        problem="" if problem is None else str(problem),
        events_checked=tally.events,
        scope=AuditVerification.Scope.FULL,
        checkpoint=newest if problem is None else 0,
        file_offset=_file_end_of(newest) if problem is None else 0,
        finished_at=timezone.now(),
    )


def _newest_checkpoint_number() -> int:
    number = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
    return int(number or 0)


def _file_end_of(number: int) -> int:
    """Where checkpoint ``number``'s line ends in the checkpoint file (0: not found)."""
    if number == 0:
        return 0
    checkpointed, problem = _checkpoints_verified(upto=number)
    return 0 if problem else checkpointed.file_offset


def audit_verified_through() -> AuditVerification | None:
    """The newest verification that found the log intact and covers a checkpoint."""
    return (
        AuditVerification.objects.filter(ok=True, checkpoint__gt=0)
        .order_by("-checkpoint", "-at", "-id")
        .first()
    )


def audit_verification_incremental(
    *, chunk_size: int = 5000, max_events: int | None = None
) -> AuditVerification | None:
    """The routine verification: what the checkpoints signed since the last verified one.

    The checkpoints after it (digest, signature, their chaining and their lines in the
    file, read from where the last verified line ended), and every event between the
    rescan point of the first and the watermark of the last, each against its
    predecessor and its own hash, in pages of ``chunk_size`` along the id; then what
    those checkpoints signed against the events, the system chain's stored head and
    the alarms they raised. Its cost follows what is new, not the log: the chains'
    older events, the operations' stored heads and the vouched heads are the full
    verification's (``audit_verify_job_step``). ``max_events`` bounds one run: it
    covers whole checkpoints up to about that many events and the next run goes on.
    With nothing verified yet it starts after the first checkpoint (the log that one
    signed is the full verification's). None when no checkpoint was ever signed.
    """
    from audit.checkpoint_file import _signers_serialised

    started = timezone.now()
    base = audit_verified_through()
    if base is None:
        first = AuditCheckpoint.objects.filter(number=1).only("digest").first()
        if first is None:
            return None
        checked, problem = _checkpoints_verified(chunk_size=chunk_size, upto=1)
        if problem:
            return _recorded(started, problem, 0, 0)
        after, expected_prev, offset = 1, first.digest, checked.file_offset
    else:
        stored = AuditCheckpoint.objects.filter(number=base.checkpoint).only("digest", "signature")
        row = stored.first()
        if row is None or not signed_by_key(row.digest, row.signature):
            return _recorded(started, f"checkpoint #{base.checkpoint} is gone or edited", 0, 0)
        after, expected_prev, offset = base.checkpoint, row.digest, base.file_offset
    newer = AuditCheckpoint.objects.filter(number__gt=after).order_by("number")
    marks = list(newer.values_list("number", "rescan_from", "watermark")[:1000])
    if not marks:  # nothing newly signed: still verified now, as far as it was
        return _recorded(started, "", 0, after, offset)
    upto, low, last_watermark = marks[0]
    for number, _, watermark in marks[1:]:
        # The checkpoints one backlog was signed in share their watermark: all or none.
        over = max_events is not None and watermark - low > max_events
        if over and watermark != last_watermark:
            break
        upto, last_watermark = number, watermark
    high = next(watermark for number, _, watermark in marks if number == upto)
    with _signers_serialised():  # a checkpoint signed and not yet in the file is not a gap
        checkpointed, problem = _checkpoints_verified(
            chunk_size=chunk_size,
            after=after,
            expected_prev=expected_prev,
            file_offset=offset,
            upto=upto,
        )
    if problem:
        return _recorded(started, problem, 0, 0)
    tally = VerifyTally()
    found = _events_linked(low, high, chunk_size=chunk_size, tally=tally)
    found = found or _signed_heads_hold(after, upto)
    if found is None:
        found = next(iter(_stored_heads_disagree()), None)
    if found is None:
        found = next(iter(_alarms_disagree(checkpointed.broken)), None)
    if found is not None:
        return _recorded(started, str(found), tally.events, 0)
    return _recorded(started, "", tally.events, upto, checkpointed.file_offset)


def _recorded(
    started: datetime, problem: str, events: int, checkpoint: int, file_offset: int = 0
) -> AuditVerification:
    return AuditVerification.objects.create(
        at=started,
        ok=not problem,
        problem=problem,
        events_checked=events,
        scope=AuditVerification.Scope.INCREMENTAL,
        checkpoint=checkpoint,
        file_offset=file_offset,
        finished_at=timezone.now(),
    )


def _events_linked(
    low: int, high: int, *, chunk_size: int, tally: VerifyTally
) -> ChainBreak | None:
    """Each event with an id in (``low``, ``high``] against its predecessor in its chain
    (read with it, along the (chain, seq) index), its own hash and, for a signed vote,
    its passkey's signature: a page at a time."""
    columns = event_columns("e.")
    sql = (
        f"SELECT {columns}, p.hash, e.id FROM audit_auditevent e LEFT JOIN"
        " audit_auditevent p ON p.operation_key = e.operation_key AND p.seq = e.seq - 1"
        " WHERE e.id > %s AND e.id <= %s ORDER BY e.id LIMIT %s"
    )
    events = EventChecks()
    try:
        found = _events_walked(sql, low, high, chunk_size, tally, events)
        # A signed vote passed before the problem found (or before the end) comes first.
        return events.first_break() or found
    finally:
        events.close()


def _events_walked(
    sql: str, low: int, high: int, chunk_size: int, tally: VerifyTally, events: EventChecks
) -> ChainBreak | None:
    after = low
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [after, high, chunk_size])
            page = cursor.fetchall()
        for fetched, row in zip(page, event_rows([item[:-2] for item in page]), strict=True):
            tally.events += 1
            predecessor = fetched[-2]
            if row.seq > 1 and predecessor is None:
                return ChainBreak(row.chain, row.seq - 1, "this event is missing (deleted)")
            prev_hash = GENESIS_HASH if row.seq == 1 else str(predecessor)
            found = events.row_break(row, seq=row.seq, prev_hash=prev_hash)
            if found is not None:
                return found
        if len(page) < chunk_size:
            return None
        after = int(page[-1][-1])


def _signed_heads_hold(after: int, upto: int) -> ChainBreak | None:
    """Every head checkpoints ``after`` + 1 … ``upto`` signed is its chain's event: one
    statement, the database joining their heads to the events."""
    if connection.vendor == "postgresql":
        heads = (
            "SELECT c.number, h.key, (h.value->>0)::bigint AS seq, h.value->>1 AS hash"
            " FROM audit_auditcheckpoint c CROSS JOIN LATERAL jsonb_each(CASE"
            " jsonb_typeof(c.heads) WHEN 'object' THEN c.heads END) h"
            " WHERE c.number > %s AND c.number <= %s"
        )
    else:
        heads = (
            "SELECT c.number, h.key, json_extract(h.value, '$[0]') AS seq,"
            " json_extract(h.value, '$[1]') AS hash FROM audit_auditcheckpoint c,"
            " json_each(CASE json_type(c.heads) WHEN 'object' THEN c.heads END) h"
            " WHERE c.number > %s AND c.number <= %s"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.number, s.key, s.seq, e.hash FROM ({heads}) s LEFT JOIN"
            " audit_auditevent e ON e.operation_key = s.key AND e.seq = s.seq"
            " WHERE e.hash IS NULL OR e.hash <> s.hash ORDER BY s.number, s.key LIMIT 1",
            [after, upto],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    number, chain, seq, found = row
    if found is None:
        return ChainBreak(str(chain), int(seq), f"checkpoint #{number} signed it; it is missing")
    return ChainBreak(
        str(chain), int(seq), f"differs from what checkpoint #{number} signed (rewritten)"
    )


def audit_verify_job_step(
    *, slice_events: int, chunk_size: int = 5000, restart_after_seconds: float | None = None
) -> AuditVerifyJob | None:
    """One slice of the full verification job: the checkpoints, or the next
    ``slice_events`` or so events (whole chains), or the last checks; progress kept.

    A job is started when none is running and the last one started more than
    ``restart_after_seconds`` ago (None: never again once one finished). When the job
    finishes, or finds a problem, its outcome is an ``AuditVerification`` of scope
    ``full``. None when there is nothing to do.
    """
    job = AuditVerifyJob.objects.exclude(phase=AuditVerifyJob.Phase.DONE).first()
    now = timezone.now()
    if job is None:
        last = AuditVerifyJob.objects.order_by("-started_at", "-id").first()
        if last is not None and (
            restart_after_seconds is None
            or (now - last.started_at).total_seconds() < restart_after_seconds
        ):
            return None
        job = AuditVerifyJob.objects.create(started_at=now, updated_at=now)
    job.slices += 1
    problem: str | None = None
    if job.phase == AuditVerifyJob.Phase.CHECKPOINTS:
        newest = _newest_checkpoint_number()
        checkpointed, problem = _checkpoints_verified(chunk_size=chunk_size, upto=newest or None)
        job.checkpoint = newest
        job.file_offset = checkpointed.file_offset
        job.phase = AuditVerifyJob.Phase.CHAINS
    elif job.phase == AuditVerifyJob.Phase.CHAINS:
        until = _slice_end(job.after_chain, slice_events)
        tally = VerifyTally()
        found = _chains_verified(
            after=job.after_chain, until=until, chunk_size=chunk_size, tally=tally
        )
        job.events_checked += tally.events
        job.chains_checked += tally.chains
        job.after_chain = until
        if until is None:
            job.phase = AuditVerifyJob.Phase.FINISH
        problem = None if found is None else str(found)
    else:
        broken = list(
            AuditCheckpoint.objects.filter(number__lte=job.checkpoint)
            .order_by("number")
            .values_list("number", "broken")
        )
        found = next(iter(_rest_verified(broken, chunk_size=chunk_size)), None)
        problem = None if found is None else str(found)
        job.phase = AuditVerifyJob.Phase.DONE
    job.updated_at = timezone.now()
    if problem is not None or job.phase == AuditVerifyJob.Phase.DONE:
        job.phase = AuditVerifyJob.Phase.DONE
        job.verification = AuditVerification.objects.create(
            at=job.started_at,
            ok=problem is None,
            problem=problem or "",
            events_checked=job.events_checked,
            scope=AuditVerification.Scope.FULL,
            checkpoint=job.checkpoint if problem is None else 0,
            file_offset=job.file_offset if problem is None else 0,
            finished_at=job.updated_at,
        )
    job.save()
    return job


def _slice_end(after: str | None, events: int) -> str | None:
    """The chain at which a slice of about ``events`` events after chain ``after`` ends
    (whole chains); None: the slice runs to the last chain."""
    start = ("", 0) if after is None else (after, _AFTER_CHAIN)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT operation_key FROM audit_auditevent WHERE (operation_key, seq) > (%s, %s)"
            " ORDER BY operation_key, seq LIMIT 1 OFFSET %s",
            [*start, max(0, events - 1)],
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])
